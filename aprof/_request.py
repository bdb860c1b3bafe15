"""``prof.request(...)``: gate a request on its replica's capture, count it, say what happened."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from aprof._state_machine import Phase

if TYPE_CHECKING:
    from aprof._scheduler import Profiler


class Request:
    """One agent-loop request to a replica, as an async context manager and its own handle.

    ``async with prof.request(replica=0, request_id="s3-t1") as req:`` waits while the
    replica's capture for the current step is starting (bounded by the start timeout), then
    lets the request go; ``req.step``, ``req.gated`` and ``req.captured`` say what happened.
    """

    __slots__ = ("_prof", "captured", "gated", "replica", "request_id", "step", "tokens")

    def __init__(self, prof: Profiler, replica: int, request_id: str | None) -> None:
        self._prof = prof
        self.replica = replica
        """The replica the request goes to."""
        self.request_id = request_id
        """The caller's identifier for the request, if any."""
        self.step: int | None = None
        """The global step the request was admitted in (``None`` outside any step)."""
        self.gated = False
        """The request waited for its replica's capture to start."""
        self.captured = False
        """A capture of its replica was active when the request went ahead."""
        self.tokens = 0
        """Tokens reported through :meth:`forward`."""

    async def __aenter__(self) -> Request:
        prof = self._prof
        self.step = prof._step
        if prof._rollout_live:
            run = prof._step_rollout.get(self.replica)
            if run is not None and run.phase is Phase.ACTIVE:
                run.admitted += 1
                self.captured = True
            else:
                await prof._admit(self, run)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def forward(self, tokens: int = 0) -> None:
        """Report progress of the request; reported tokens add up."""
        self.tokens += tokens

    def __repr__(self) -> str:
        return (
            f"Request(replica={self.replica}, request_id={self.request_id!r}, step={self.step}, "
            f"gated={self.gated}, captured={self.captured})"
        )
