"""Every exception ``servers`` raises on purpose, each an :class:`aprof.AprofError`.

Each keeps the built-in base that says what kind of failure it is (``RuntimeError`` for a
server that cannot do it now or a call at the wrong moment, ``ValueError`` for a value that
cannot be used), so that ``except RuntimeError`` keeps working beside ``except
aprof.AprofError``. A call at the wrong moment (before ``open()``, a start while a capture
is held) raises ``aprof.UsageError``. The reference server (``servers.reference``) keeps its
own.
"""

from __future__ import annotations

from aprof import AprofError

BODY_SHOWN = 500
"""Characters of an error body kept in messages (servers may answer with whole pages)."""


class ServerError(AprofError):
    """A server answered a request with a status outside 2xx (a redirect included)."""

    def __init__(
        self, method: str, url: str, status: int, body: str, location: str | None = None
    ) -> None:
        # All go into args so the error pickles (Ray ships exceptions between processes).
        super().__init__(method, url, status, body, location)
        self.method = method
        self.url = url
        self.status = status
        """The HTTP status code."""
        self.body = body
        """The response body as text."""
        self.location = location
        """Where a redirect pointed (credentials removed), ``None`` for other answers."""

    def __str__(self) -> str:
        text = f"{self.method} {self.url} answered {self.status}"
        if self.location is not None:
            text += f" (a redirect to {self.location[:BODY_SHOWN]}, not followed)"
        body = " ".join(self.body.split())[:BODY_SHOWN]
        return text + (f": {body}" if body else "")


class AnswerTooLargeError(AprofError):
    """A server's answer was longer than ``limits.answer_bytes``: it was not read."""

    def __init__(self, method: str, url: str, status: int, limit: int) -> None:
        super().__init__(method, url, status, limit)  # pickles, as ServerError does
        self.method = method
        self.url = url
        self.status = status
        """The HTTP status code of the refused answer."""
        self.limit = limit

    def __str__(self) -> str:
        return (
            f"{self.method} {self.url} answered more than {self.limit} bytes (limits.answer_bytes)"
        )


class ProfilingDisabledError(AprofError, RuntimeError):
    """The server has no profiling routes (404): profiling was not enabled at its launch."""


class SessionConflictError(AprofError, RuntimeError):
    """The server holds a profiling session aprof did not start (409); aprof leaves it alone."""


class LaunchError(AprofError, RuntimeError):
    """A server did not come up healthy; the message holds the tail of its log."""


class VersionError(AprofError, ValueError):
    """A version that cannot be read: text that is not ``X.Y`` or ``X.Y.Z``, a server whose
    version route gives none, an engine package that does not say. Pass ``version=``."""


class UnsupportedError(AprofError, ValueError):
    """The engine, at its version or as it was launched, cannot do what was asked: a tool it
    cannot run, launch-time bounds before vLLM 0.12, a window whose bounds differ from those
    the server was launched with. The message says what would work."""
