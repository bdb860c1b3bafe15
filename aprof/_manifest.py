"""The run manifest: what every window captured, rewritten atomically on every change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from aprof._layout import write_atomic

if TYPE_CHECKING:
    from aprof._capture import WorkerCapture

SCHEMA = "aprof.manifest/1"
FILENAME = "manifest.json"

WindowState = Literal["running", "done", "failed", "timeout", "skipped"]
StopReason = Literal["auto_stop", "step_end", "run_end", "error", "cancelled"]
EnforcedBy = Literal["server", "aprof", "none"]
FINAL_STATES: frozenset[str] = frozenset({"done", "failed", "timeout", "skipped"})


class ManifestError(ValueError):
    """A manifest file that cannot be read back."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class ForwardSteps(_Model):
    """Engine forward steps of a window: asked for, seen, and who bounded the window."""

    delay: int = 0
    requested: int | None = None
    observed: int | None = None
    enforced_by: EnforcedBy = "none"
    counted_from: Literal["trace", "counter"] | None = None
    """``observed`` counted from the capture's files (``trace``) or the engine's counter."""


class RequestCounts(_Model):
    """Requests admitted to a replica while its window was starting or active."""

    admitted: int = 0
    gated: int = 0


class FileEntry(_Model):
    """One file (or trace folder) of a window; ``path`` is relative to ``save_path``."""

    path: str
    bytes: int


class RankCapture(_Model):
    """One capture of one rank inside a worker group's role window."""

    rank: int
    stage: str | None
    """The stage of a discrete capture; ``None`` for a capture of the whole window."""
    step: int
    last_step: int
    """The last global step the capture covered (later than ``step`` in a continuous window)."""
    state: Literal["done", "failed"]
    files: list[FileEntry]
    error: str | None
    note: str | None
    """What the capture tool says the reader should know."""
    started_ns: int
    stopped_ns: int

    @classmethod
    def of(cls, capture: WorkerCapture, *, window_last_step: int) -> RankCapture:
        """The record of ``capture``, made in a window that covered up to ``window_last_step``."""
        last_step = capture.last_step
        if capture.stage is None:
            # A worker group tells its workers the first step of a continuous window only.
            last_step = max(last_step, window_last_step)
        return cls(
            rank=capture.rank,
            stage=capture.stage,
            step=capture.step,
            last_step=last_step,
            state=capture.state,
            files=[FileEntry(path=f.path, bytes=f.bytes) for f in capture.files],
            error=capture.error,
            note=capture.note,
            started_ns=capture.started_ns,
            stopped_ns=capture.stopped_ns,
        )


class WindowRecord(_Model):
    """One (step, target) window as the manifest shows it."""

    step: int
    target: str
    kind: Literal["rollout", "role"]
    tool: str
    state: WindowState = "running"
    stop_reason: StopReason | None = None
    started_ns: int | None = None
    stopped_ns: int | None = None
    forward_steps: ForwardSteps = Field(default_factory=ForwardSteps)
    requests: RequestCounts = Field(default_factory=RequestCounts)
    files: list[FileEntry] = Field(default_factory=list)
    error: str | None = None
    captures: list[RankCapture] = Field(default_factory=list)
    """Per-rank captures of a worker group's window; empty for other role targets, and not
    written for rollout windows."""

    @model_serializer(mode="wrap")
    def _rollout_without_captures(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.kind == "rollout":
            data.pop("captures", None)
        return data


class Note(_Model):
    """Something a reader of the run should know that is not a failure."""

    step: int | None
    target: str | None
    text: str


class Clock(_Model):
    """One instant read on both clocks, to place monotonic timestamps on the wall clock."""

    wall_ns: int
    monotonic_ns: int


class TimelineFile(_Model):
    """One process's timeline file (aprof's spans as a Chrome trace) and what it holds."""

    path: str
    """Relative to ``save_path``: ``timeline/<process>.trace.json.gz``."""
    process: str
    bytes: int
    events: int
    """Spans, steps and windows written to it."""
    dropped: int
    """Events that did not fit into ``timeline.buffer_events`` and were not recorded."""


class Manifest(_Model):
    """Every window of one run, with its state, files and counts."""

    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    clock: Clock
    save_path: str
    windows: list[WindowRecord] = Field(default_factory=list)
    notes: list[Note] = Field(default_factory=list)
    timeline: list[TimelineFile] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def window(self, step: int, target: str) -> WindowRecord | None:
        """The window of ``target`` for ``step``, if there is one."""
        for record in self.windows:
            if record.step == step and record.target == target:
                return record
        return None

    def to_json(self) -> str:
        """The manifest as the JSON text written to disk."""
        return self.model_dump_json(by_alias=True, indent=1)


def write_manifest(manifest: Manifest, path: Path) -> None:
    """Write ``manifest`` to ``path`` atomically: a reader sees the old file or the new one."""
    write_atomic(path, manifest.to_json())


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest back from its file or from the ``save_path`` folder holding it.

    Raises ``ManifestError`` naming the file and what is wrong with it.
    """
    file = Path(path)
    if file.is_dir():
        file = file / FILENAME
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ManifestError(f"{file}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ManifestError(f"{file}: expected schema {SCHEMA!r}, found {found!r}")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ManifestError(f"{file}: {where}: {first['msg']}") from None
