"""The one error an LLM call raises."""

from __future__ import annotations

from typing import Literal

FailureKind = Literal["connect", "timeout", "disconnected", "status", "response"]
"""How a call failed: ``connect`` (the connection was refused or timed out, nothing was
sent), ``timeout`` (no full answer within the per-request timeout), ``disconnected`` (the
connection broke after the request may have reached the server), ``status`` (a non-2xx
answer), ``response`` (an answer that is not what the API promises, or an error inside a
stream)."""


class LLMError(Exception):
    """A completion request failed; says which replica, which URL, how and why."""

    def __init__(
        self, replica: int, url: str, kind: FailureKind, cause: str, status: int | None = None
    ) -> None:
        # Everything goes into args so the error pickles (trajectories may cross processes).
        super().__init__(replica, url, kind, cause, status)
        self.replica = replica
        """The replica the request went to."""
        self.url = url
        """The endpoint URL."""
        self.kind: FailureKind = kind
        """How the call failed (see :data:`FailureKind`)."""
        self.cause = cause
        """What went wrong, in words."""
        self.status = status
        """The HTTP status of a ``status`` failure."""

    def __str__(self) -> str:
        status = f" {self.status}" if self.status is not None else ""
        return f"replica {self.replica} ({self.url}): {self.kind}{status}: {self.cause}"
