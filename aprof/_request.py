"""``prof.request(...)``: gate a request on its replica's capture, count it, say what happened."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from aprof._chrome_trace import REQUEST
from aprof._state_machine import Phase
from aprof._timeline import OPEN_AT_CLOSE, now_ns

if TYPE_CHECKING:
    from aprof._scheduler import Profiler


class Request:
    """One agent-loop request to a replica, as an async context manager and its own handle.

    ``async with prof.request(replica=0, request_id="s3-t1") as req:`` waits while the
    replica's capture for the current step is starting (bounded by the start timeout), then
    lets the request go; ``req.step``, ``req.gated`` and ``req.captured`` say what happened.
    The request is one timeline span, recorded when it ends.
    """

    __slots__ = (
        "_begin",
        "_prof",
        "_timeline",
        "captured",
        "gated",
        "replica",
        "request_id",
        "step",
        "tokens",
    )

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
        self._timeline = prof._timeline
        self._begin = 0

    async def __aenter__(self) -> Request:
        prof = self._prof
        self.step = prof._step
        timeline = self._timeline
        if timeline is not None:
            self._begin = now_ns()
            timeline.open.add(self)
        if prof._rollout_live:
            run = prof._step_rollout.get(self.replica)
            if run is not None and run.phase is Phase.ACTIVE:
                run.admitted += 1
                self.captured = True
            else:
                try:
                    await prof._admit(self, run)
                except BaseException as exc:  # no __aexit__ follows a failed __aenter__
                    if timeline is not None:
                        self._end(now_ns(), type(exc).__name__)
                    raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timeline is not None:
            self._end(now_ns(), None if exc_type is None else exc_type.__name__)

    def end_at_close(self, end: int) -> None:
        """Record the request as ended at ``end`` because the timeline closes."""
        self._end(end, OPEN_AT_CLOSE)

    def _end(self, end: int, note: str | None) -> None:
        timeline = self._timeline
        assert timeline is not None
        try:
            timeline.open.remove(self)
        except KeyError:
            return  # ended already, at close
        event = (
            REQUEST,
            self._begin,
            end,
            self.replica,
            self.request_id,
            self.step,
            self.gated,
            self.captured,
            self.tokens,
            note,
        )
        events = timeline.events
        if len(events) < timeline.room:  # Timeline.add's common case, inlined: the hot path
            events.append(event)
        else:
            timeline.add(event)

    def forward(self, tokens: int = 0) -> None:
        """Report progress of the request; reported tokens add up."""
        self.tokens += tokens

    def __repr__(self) -> str:
        return (
            f"Request(replica={self.replica}, request_id={self.request_id!r}, step={self.step}, "
            f"gated={self.gated}, captured={self.captured})"
        )
