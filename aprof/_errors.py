"""Every exception aprof raises on purpose, under one base, and ``describe(exc)``.

Each error keeps the built-in base that says what kind of mistake it is (``ValueError`` for a
bad value, ``RuntimeError`` for a bad moment, ``OSError`` for a file), so that ``except
ValueError`` keeps working beside ``except aprof.AprofError``. ``servers`` and ``agentloop``
derive theirs from :class:`AprofError` too; docs/errors.md draws the whole tree.

Standard library only: the timeline's writer process loads it with ``aprof._safe_files``.
"""

from __future__ import annotations

import sys


class AprofError(Exception):
    """The base of every exception aprof, ``servers`` and ``agentloop`` raise on purpose."""


class ConfigError(AprofError, ValueError):
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


class ManifestError(AprofError, ValueError):
    """A manifest file that cannot be read back."""


class UsageError(AprofError, RuntimeError):
    """aprof was called at the wrong moment: a profiler opened twice, a step before the
    profiler is open or while another step is, a target added to a closed profiler."""


class StepError(AprofError, ValueError):
    """A global step number that is not an integer >= 1."""


class ExportError(AprofError, ValueError):
    """A step, role or stage whose traces cannot be exported as asked (``aprof export hta``)."""


class TargetError(AprofError, ValueError):
    """A capture target or worker group that breaks aprof's rules (a name given twice, a
    replica or rank that is not an index, an unknown kind, a group without workers)."""


class UnsafeNameError(AprofError, ValueError):
    """A name aprof puts into a path (a target, role or process name) that is empty, not a
    string, or not path-safe."""


class CaptureError(AprofError, RuntimeError):
    """Windows failed while ``strict: true`` asked for failures to be raised.

    ``windows`` holds ``(step, target, error)`` for each failed window.
    """

    def __init__(self, windows: list[tuple[int, str, str]]) -> None:
        super().__init__(windows)
        self.windows = windows

    def __str__(self) -> str:
        return "; ".join(f"step {step}, {target}: {error}" for step, target, error in self.windows)


class WorkerGroupError(AprofError, RuntimeError):
    """A worker group's window could not begin or end on any of its ranks; the message names
    each rank and why (recorded as the window's error)."""


class ToolError(AprofError, RuntimeError):
    """A capture tool could not do what it was asked: start while its capture runs, stop
    with none running, or its framework's call failed."""


class ToolUnavailableError(ToolError):
    """The configured capture tool cannot run on this machine; the message says why."""


class WindowStateError(AprofError, RuntimeError):
    """A window was asked to move where its transition table does not go: a bug in aprof,
    refused so that the manifest never says what did not happen."""


class BodyTooLargeError(AprofError):
    """An answer's body is longer than the reader's limit: it was read no further and its
    connection is closed. Each client raises its own error for it (the adapters'
    ``servers.AnswerTooLargeError``, ``LLMClient``'s ``LLMError`` of kind ``response``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit
        """The limit in bytes that the answer passed."""

    def __str__(self) -> str:
        return f"the answer is longer than {self.limit} bytes"


class UnsafePathError(AprofError, OSError):
    """A link, or something that is not a folder, where aprof needs a folder of its own."""


class NotRegularFileError(AprofError, OSError):
    """A FIFO, a device, a folder or a socket where a file is read."""


class FileTooLargeError(AprofError, OSError):
    """A file larger than the most a reader takes."""


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
