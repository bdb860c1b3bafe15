"""What crosses the control channel: a capture request, and the run's answer to it.

Both are plain JSON documents (``control/requests/<id>.json`` and ``control/answers/<id>.json``
below ``save_path``, or the bodies of the HTTP endpoint); ``prof.capture(...)`` takes the same
request and returns the same answer.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from aprof._config import StepSelection, config_error, key_member, show_value
from aprof._errors import ConfigError
from aprof._manifest import RequestedBy

REQUEST_SCHEMA: Final = "aprof.capture-request/1"
ANSWER_SCHEMA: Final = "aprof.capture-answer/1"
MAX_REQUEST_BYTES = 64 * 1024
"""The largest request read; a longer one is answered as too large, unread."""
MAX_STEPS = 1000
"""The most steps one request names (``next`` or ``steps``)."""
MAX_FORWARD_STEPS = 1_000_000
REQUEST_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")
"""A request's id, also its file name (with ``.json``): path-safe, no leading dot."""


_Count = Annotated[int, Strict(), Field(ge=1)]


class _Message(BaseModel):
    # Read by JSON names only (``schema``, not the field's ``schema_``): one way to write each.
    model_config = ConfigDict(extra="forbid", frozen=True)


def new_request_id() -> str:
    """A fresh request id: its time, then random hex (ids sort by time)."""
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4)


class CaptureRequest(_Message):
    """Capture the next ``next`` global steps, or the listed ``steps``, on the chosen targets.

    ``replicas`` and ``roles`` narrow the targets (default: every replica with a target and
    every role the config captures); ``forward_steps`` bounds each rollout window in engine
    forward steps (default: ``rollout.forward_steps``).
    """

    schema_: Literal["aprof.capture-request/1"] = Field(REQUEST_SCHEMA, alias="schema")
    id: Annotated[str, Strict()] = Field(default_factory=new_request_id)
    next: _Count | None = Field(None, le=MAX_STEPS)
    steps: list[int] | None = None
    replicas: list[Annotated[int, Strict(), Field(ge=0)]] | None = Field(None, max_length=4096)
    roles: list[Annotated[str, Strict()]] | None = Field(None, max_length=256)
    forward_steps: _Count | None = Field(None, le=MAX_FORWARD_STEPS)

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        if not REQUEST_ID.fullmatch(value):
            raise ConfigError(
                "",
                f"expected 1-64 of [A-Za-z0-9_.-], not starting with '.', got {show_value(value)}",
            )
        return value

    @field_validator("steps", mode="before")
    @classmethod
    def _step_spec(cls, value: object) -> object:
        if value is None:
            return None
        steps = StepSelection.parse(value, key="")
        if steps.explicit is None:
            raise ConfigError("", "name the steps ('120,130-132' or a list), not {every: k}")
        if not steps.explicit:
            raise ConfigError("", "names no step")
        if len(steps.explicit) > MAX_STEPS:
            raise ConfigError("", f"names more than {MAX_STEPS} steps")
        return list(steps.explicit)

    @field_validator("replicas", "roles")
    @classmethod
    def _distinct(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None:
            if not value:
                raise ConfigError("", "is empty; leave it out to mean all")
            seen: set[Any] = set()
            for i, item in enumerate(value):
                if item in seen:
                    raise ConfigError(f"[{i}]", f"{show_value(item)} is listed twice")
                seen.add(item)
        return value

    @model_validator(mode="after")
    def _one_of(self) -> CaptureRequest:
        if self.next is not None and self.steps is not None:
            raise ConfigError(None, "give one of next and steps, not both")
        if self.next is None and self.steps is None:
            return self.model_copy(update={"next": 1})
        return self

    @classmethod
    def parse(cls, data: object) -> CaptureRequest:
        """A request from plain data; raises ``ConfigError`` naming the field at fault."""
        if not isinstance(data, dict):
            raise ConfigError(None, f"a capture request is a JSON object, got {show_value(data)}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise config_error(exc, cls) from None

    @classmethod
    def of(
        cls,
        next: int | None = None,
        steps: str | Sequence[int] | None = None,
        *,
        replicas: Sequence[int] | None = None,
        roles: Sequence[str] | None = None,
        forward_steps: int | None = None,
    ) -> CaptureRequest:
        """The request of ``prof.capture(...)``'s arguments (``None``: left out); raises
        ``ConfigError`` naming the argument at fault."""
        given = {
            "next": next,
            "steps": steps,
            "replicas": replicas,
            "roles": roles,
            "forward_steps": forward_steps,
        }
        return cls.parse(
            {k: list(v) if isinstance(v, tuple) else v for k, v in given.items() if v is not None}
        )

    def describe(self) -> str:
        """The request in a few words: ``next 2 steps, replicas 0,3``."""
        parts = [f"next {self.next} step(s)" if self.next else f"steps {_ranges(self.steps)}"]
        if self.replicas is not None:
            parts.append("replicas " + ",".join(map(str, self.replicas)))
        if self.roles is not None:
            parts.append("roles " + ",".join(self.roles))
        if self.forward_steps is not None:
            parts.append(f"{self.forward_steps} forward steps")
        return ", ".join(parts)


class CaptureAnswer(_Message):
    """What the run did with a capture request: accepted (with what it will capture, and what
    was already selected) or refused (with why)."""

    schema_: Literal["aprof.capture-answer/1"] = Field(ANSWER_SCHEMA, alias="schema")
    id: str
    accepted: bool
    requested_by: RequestedBy = "on_demand"
    steps: list[int] = Field(default_factory=list)
    """The global steps that will be captured for this request."""
    targets: list[str] = Field(default_factory=list)
    """The targets whose windows those steps open."""
    forward_steps: int | None = None
    """Engine forward steps each rollout window captures (``None``: until its step ends)."""
    merged: list[str] = Field(default_factory=list)
    """What was selected already (by the config, or an earlier request): captured once."""
    reason: str | None = None
    """Why the request was refused."""
    run_id: str | None = None
    decided_at: int | None = None
    """The first global step not begun when the run decided."""

    def line(self) -> str:
        """The answer as one line, as ``aprof capture`` prints it."""
        if not self.accepted:
            return f"refused: {self.reason}"
        text = f"accepted: steps {_ranges(self.steps)} on {', '.join(self.targets) or 'no target'}"
        if self.forward_steps is not None:
            text += f" ({self.forward_steps} forward steps per rollout window)"
        if self.merged:
            text += f"; already selected: {'; '.join(self.merged)}"
        return text


def refusal(request_id: str, reason: str, **fields: Any) -> CaptureAnswer:
    """A refused answer to request ``request_id``."""
    return CaptureAnswer(id=request_id, accepted=False, reason=reason, **fields)


def bad_field(exc: ConfigError) -> str:
    """A request's ``ConfigError`` as the reason of its refusal."""
    key = exc.key
    if key and not key.startswith(("[", ".")):
        key = key_member(key)
    return (
        f"malformed request: {key.lstrip('.')}: {exc.reason}"
        if key
        else f"malformed request: {exc.reason}"
    )


def _ranges(steps: list[int] | None) -> str:
    return str(StepSelection(explicit=tuple(steps or ())))
