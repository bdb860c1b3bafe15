"""Exceptions aprof raises to its callers."""

from __future__ import annotations

import sys


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range.

    `key` is the dotted key path (`rollout.replicas[1]`) or the file the problem is in;
    None when the problem is the input as a whole. `reason` says what is wrong.
    """

    def __init__(self, key: str | None, reason: str) -> None:
        # Both go into args so the error pickles (Ray ships exceptions between processes).
        super().__init__(key, reason)
        self.key = key
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}" if self.key else self.reason


class CaptureError(RuntimeError):
    """Windows failed while ``strict: true`` asked for failures to be raised.

    `windows` holds ``(step, target, error)`` for each failed window.
    """

    def __init__(self, windows: list[tuple[int, str, str]]) -> None:
        super().__init__(windows)
        self.windows = windows

    def __str__(self) -> str:
        return "; ".join(f"step {step}, {target}: {error}" for step, target, error in self.windows)


MAX_DESCRIBED = 400
"""Most characters of a message ``describe`` keeps; a longer one keeps its start and its end."""


def describe(exc: BaseException) -> str:
    """``exc`` as aprof records a failure: ``Type: message`` on one line, or ``Type`` alone.

    Runs of whitespace (the newlines of a remote traceback) become one space, and a message
    longer than MAX_DESCRIBED characters loses its middle. A Ray task error is described by
    the exception the remote call raised, whose message its own text buries in a traceback.
    """
    exc = _remote_cause(exc)
    text = " ".join(str(exc).split())
    if len(text) > MAX_DESCRIBED:
        tail = MAX_DESCRIBED // 4
        text = f"{text[: MAX_DESCRIBED - tail - 5]} ... {text[-tail:]}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _remote_cause(exc: BaseException) -> BaseException:
    # Only a process that imported Ray can hold one of its errors; aprof never imports it.
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is not None and isinstance(exc, ray_exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc
