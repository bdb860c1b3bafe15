"""Exceptions aprof raises to its callers."""

from __future__ import annotations


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


def describe(exc: BaseException) -> str:
    """``exc`` as the manifest shows a failure: ``Type: message``, or ``Type`` alone."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
