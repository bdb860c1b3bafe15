"""The driver side of role windows: one capture target over the ranks of a worker group."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from aprof._capture import CaptureResult, TargetKind, Window, WorkerCapture, WorkerTimeline
from aprof._config import ConfigSource, LimitsConfig, TimeoutsConfig, load_config
from aprof._errors import TargetError, WorkerGroupError, describe
from aprof._layout import check_name
from aprof._logging import logger
from aprof._workers.profiler import WorkerProfiler
from aprof.abc import WorkerHandle

T = TypeVar("T")

RANK_SHARE = 0.9
"""The share of ``timeouts.start_s`` (``stop_s``) each rank's begin (end) may take.

The scheduler bounds the whole start (stop) of a window by those timeouts; ranks run
concurrently, each bounded by this share, so the group answers before the scheduler gives up
and one slow rank fails only its own capture.
"""


class LocalWorker:
    """A :class:`WorkerHandle` for a ``WorkerProfiler`` in the driver's own process.

    ``begin`` and ``end`` run inline on the event loop's thread: a torch capture must start
    and stop on one thread.
    """

    def __init__(self, profiler: WorkerProfiler) -> None:
        self.profiler = profiler
        self.rank = profiler.rank
        self._first = len(profiler.captures)

    def begin_step(self, step: int) -> None:
        """Open the window at global step ``step``, synchronously (the driver decided it:
        the worker's own config need not select the step)."""
        # A window whose begin answered after the driver's bound may never have been ended:
        # close it, or the new window would continue it.
        self.profiler.close()
        self._first = len(self.profiler.captures)
        self.profiler.begin_window(step)

    def end_step(self) -> list[WorkerCapture]:
        """Close the window, synchronously; the captures made since :meth:`begin_step`, once."""
        # A continuous window ends once, after its last step, and the worker was told its first
        # step only: its own continuous logic would keep the capture open, so close it here.
        self.profiler.end_step()
        self.profiler.close()
        made = self.profiler.captures[self._first :]
        self._first = len(self.profiler.captures)
        return made

    async def begin(self, step: int) -> None:
        """See :meth:`begin_step`."""
        self.begin_step(step)

    async def end(self) -> list[WorkerCapture]:
        """See :meth:`end_step`."""
        return self.end_step()

    async def timeline(self) -> WorkerTimeline | None:
        """See :meth:`WorkerProfiler.hand_over_timeline`."""
        return self.profiler.hand_over_timeline()


@dataclass(frozen=True, slots=True)
class _Failure:
    error: str
    timed_out: bool


class WorkerGroup:
    """A role capture target over the ranks of one worker group.

    A window begins on every rank the configuration selects for ``role``, all at once, and ends
    on every rank that began. Each rank's call is bounded on its own (see ``RANK_SHARE``): a
    rank that raises or hangs fails its own capture only, and the window fails only when every
    selected rank failed. Traces go to ``step_<n>/<role>/rank_<k>/``.
    """

    kind: TargetKind = "role"
    replica: int | None = None
    enforces_window = False

    def __init__(
        self,
        role: str,
        workers: Sequence[WorkerHandle],
        cfg: ConfigSource,
        *,
        name: str | None = None,
    ) -> None:
        """``cfg`` is the configuration the workers got; its ``roles.<role>`` selects ranks.

        Raises ``ValueError`` for an empty group or a rank held by two workers.
        """
        config = load_config(cfg)
        self.role = check_name(role, "role")
        self.name = check_name(name or role, "target name")
        self.workers = tuple(workers)
        ranks = [w.rank for w in self.workers]
        if not ranks:
            raise TargetError(f"worker group {role!r} has no workers")
        if len(set(ranks)) != len(ranks):
            raise TargetError(f"worker group {role!r} holds a rank twice: {sorted(ranks)}")
        selection = config.roles.get(role)
        self.selected = tuple(
            w for w in self.workers if selection is not None and selection.selects(w.rank)
        )
        """The workers that capture; only these are driven."""
        self._tool = config.global_profiler.tool
        self._bounds(config.timeouts)
        self._began: list[tuple[WorkerHandle, int]] = []  # with the time each began
        self._lost: list[WorkerCapture] = []  # ranks that did not begin the open window
        # Ranks whose begin ran out of time: a remote call goes on (Ray does not cancel it),
        # so the rank may begin late; its end closes what it opened.
        self._late: list[tuple[WorkerHandle, int]] = []

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Take the profiler's time bounds for each rank's calls (``limits`` are not used:
        ranks answer through their own handles)."""
        self._bounds(timeouts)

    async def aclose(self) -> None:
        """Nothing to release: every worker owns its profiler."""

    async def start(self, window: Window) -> None:
        """Begin ``window`` on every selected rank; raise when none began."""
        if not self.selected:
            ranks = ", ".join(str(w.rank) for w in self.workers)
            raise WorkerGroupError(f"roles.{self.role} selects none of the group's ranks ({ranks})")
        self._began, self._lost, self._late = [], [], []
        await asyncio.gather(*(self._begin(w, window.step) for w in self.selected))
        if not self._began:
            raise WorkerGroupError(f"no rank began: {_errors(self._lost)}")

    async def stop(self, window: Window) -> CaptureResult:
        """End ``window`` on every rank that began or ran out of time beginning; raise when
        every selected rank failed."""
        began, lost, late = self._began, self._lost, self._late
        self._began, self._lost, self._late = [], [], []
        ended = await asyncio.gather(
            *(self._end(w, t, window.step) for w, t in began),
            *(self._end_late(w) for w, _ in late),
        )
        captures = sorted([*lost, *(c for found in ended for c in found)], key=lambda c: c.rank)
        failed = [c for c in captures if c.state == "failed"]
        # A rank failed when it has failed captures and no good one (none at all is no failure).
        failed_ranks = {c.rank for c in failed} - {c.rank for c in captures if c.state == "done"}
        if failed_ranks >= {w.rank for w in self.selected}:
            raise WorkerGroupError(f"every rank failed: {_errors(failed)}")
        return CaptureResult(
            files=tuple(Path(f.path) for c in captures for f in c.files),
            note=f"failed captures: {_errors(failed)}" if failed else None,
            captures=tuple(captures),
        )

    async def forward_steps(self) -> int | None:
        """Engine workers have no forward-step counter."""
        return None

    async def timelines(self) -> list[WorkerTimeline]:
        """The timelines of the selected ranks as written so far, asked of all at once (each
        bounded as an end is); a rank that fails or has none is left out."""
        found = await asyncio.gather(
            *(self._call(w.rank, "timeline", w.timeline, self._end_s) for w in self.selected)
        )
        return [t for t in found if isinstance(t, WorkerTimeline)]

    def _bounds(self, timeouts: TimeoutsConfig) -> None:
        self._begin_s = RANK_SHARE * timeouts.start_s
        self._end_s = RANK_SHARE * timeouts.stop_s

    async def _begin(self, worker: WorkerHandle, step: int) -> None:
        started_ns = time.time_ns()
        outcome = await self._call(worker.rank, "begin", lambda: worker.begin(step), self._begin_s)
        if isinstance(outcome, _Failure):
            self._lost.append(self._failed(worker.rank, step, started_ns, outcome.error))
            if outcome.timed_out:
                self._late.append((worker, started_ns))
        else:
            self._began.append((worker, started_ns))

    async def _end(self, worker: WorkerHandle, started_ns: int, step: int) -> list[WorkerCapture]:
        outcome = await self._call(worker.rank, "end", worker.end, self._end_s)
        if isinstance(outcome, _Failure):
            return [self._failed(worker.rank, step, started_ns, outcome.error)]
        return list(outcome)

    async def _end_late(self, worker: WorkerHandle) -> list[WorkerCapture]:
        """The captures of a rank that began late, if any (its begin failure is recorded)."""
        outcome = await self._call(worker.rank, "end", worker.end, self._end_s)
        return [] if isinstance(outcome, _Failure) else list(outcome)

    async def _call(
        self, rank: int, what: str, call: Callable[[], Awaitable[T]], limit_s: float
    ) -> T | _Failure:
        bound = asyncio.timeout(limit_s)
        try:
            async with bound:
                return await call()
        except Exception as exc:  # TimeoutError included: a failing rank costs its capture only
            timed_out = bound.expired()
            if timed_out:
                error = f"{what} timed out after {limit_s:g}s"
            else:
                error = f"{what} failed: {describe(exc)}"
        logger.warning("aprof worker rank failed", role=self.role, rank=rank, error=error)
        return _Failure(error, timed_out)

    def _failed(self, rank: int, step: int, started_ns: int, error: str) -> WorkerCapture:
        return WorkerCapture(
            step=step,
            last_step=step,
            role=self.role,
            rank=rank,
            stage=None,
            tool=self._tool,
            state="failed",
            files=(),
            error=error,
            note=None,
            started_ns=started_ns,
            stopped_ns=time.time_ns(),
        )


def _errors(captures: Sequence[WorkerCapture]) -> str:
    return "; ".join(f"rank {c.rank}: {c.error}" for c in captures)
