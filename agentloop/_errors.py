"""Every exception agentloop raises on purpose, each an :class:`aprof.AprofError`.

Each keeps the built-in base that says what kind of failure it is (``ValueError`` for a value
that cannot be used, ``RuntimeError`` for a call at the wrong moment), so that ``except
ValueError`` keeps working beside ``except aprof.AprofError``. A completion request that fails
raises one error, :class:`LLMError`, whatever went wrong.
"""

from __future__ import annotations

from typing import Literal

from aprof import AprofError

FailureKind = Literal["connect", "timeout", "disconnected", "status", "response"]
"""How a call failed: ``connect`` (the connection was refused or timed out, nothing was
sent), ``timeout`` (no full answer within the per-request timeout), ``disconnected`` (the
connection broke after the request may have reached the server), ``status`` (a non-2xx
answer), ``response`` (an answer that is not what the API promises, one longer than
``max_answer_bytes``, or an error inside a stream)."""


class LLMError(AprofError):
    """A completion request failed; says which replica, which URL, how and why."""

    def __init__(
        self, replica: int, url: str, kind: FailureKind, cause: str, status: int | None = None
    ) -> None:
        # Everything goes into args so the error pickles (trajectories may cross processes).
        super().__init__(replica, url, kind, cause, status)
        self.replica = replica
        """The replica the request went to."""
        self.url = url
        """The endpoint URL (without any user and password)."""
        self.kind: FailureKind = kind
        """How the call failed (see :data:`FailureKind`)."""
        self.cause = cause
        """What went wrong, in words."""
        self.status = status
        """The HTTP status of a ``status`` failure."""

    def __str__(self) -> str:
        status = f" {self.status}" if self.status is not None else ""
        return f"replica {self.replica} ({self.url}): {self.kind}{status}: {self.cause}"


class BadAnswer(AprofError, ValueError):
    """The server answered with something the API does not promise; the message says what.
    ``LLMClient`` raises it as an :class:`LLMError` of kind ``response``."""


class PromptError(AprofError, ValueError):
    """A token-ID prompt that is empty or holds something other than integers >= 0: refused
    before anything is sent."""


class CalculatorError(AprofError, ValueError):
    """The expression is not plain arithmetic, or cannot be computed; the message says why."""
