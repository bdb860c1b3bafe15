"""``AgentLoopRunner``: many rollouts at once, per step (synchronous RL) or as a stream
across steps (fully-async RL)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

import structlog

from agentloop._loop import AgentLoop, SpanFactory
from agentloop._trajectory import Sample, Trajectory

_log = structlog.get_logger("agentloop")


class AgentLoopRunner:
    """Runs ``loop`` over many samples, at most ``concurrency`` rollouts at a time.

    Synchronous RL: ``async with prof.step(n): trajs = await runner.run_batch(samples)``.
    Fully-async RL: ``async with runner.stream(samples, max_staleness=1) as rollouts:`` keeps
    rolling out in the background, across step boundaries, and ``await rollouts.take(k)``
    hands over finished trajectories. Every request belongs to the step it was admitted in
    (``turn.step``); ``trajectory.step`` is the step its rollout began in. With a profiler, each
    trajectory :meth:`RolloutStream.take` hands over in a step records its staleness there (a
    ``trajectory`` span, see :meth:`RolloutStream.take`), which ``aprof report`` counts per step.
    """

    def __init__(self, loop: AgentLoop, *, concurrency: int = 32) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.loop = loop
        self.concurrency = concurrency

    async def run_batch(self, samples: Iterable[Sample]) -> list[Trajectory]:
        """Roll out every sample; the trajectories in the order of ``samples``.

        A rollout that fails is returned with its ``error``; the others go on. Cancelling
        the call cancels every rollout in flight.
        """
        todo = list(samples)
        done: list[Trajectory | None] = [None] * len(todo)
        queue = iter(enumerate(todo))

        async def work() -> None:
            for index, sample in queue:  # the workers share one iterator
                done[index] = await self._rollout(sample)

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self.concurrency, len(todo))):
                group.create_task(work())
        trajectories = [traj for traj in done if traj is not None]
        failed = sum(not traj.ok for traj in trajectories)
        _log.debug("batch rolled out", trajectories=len(trajectories), failed=failed)
        return trajectories

    def stream(
        self,
        samples: Iterable[Sample],
        *,
        max_staleness: int = 1,
        max_buffered: int | None = None,
    ) -> contextlib.AbstractAsyncContextManager[RolloutStream]:
        """Roll out ``samples`` in the background while the block runs (fully-async RL).

        ``samples`` may be endless. Finished trajectories wait in a buffer; while it holds
        ``max_buffered`` (default: ``concurrency``) no new rollout begins.
        :meth:`RolloutStream.take` drops those begun more than ``max_staleness`` steps before
        the profiler's current step, and records the staleness of those it hands over (with a
        profiler, inside a step). Leaving the block cancels the rollouts in flight.
        """
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        buffered = self.concurrency if max_buffered is None else max_buffered
        if buffered < 1:
            raise ValueError(f"max_buffered must be >= 1, got {buffered}")
        return self._stream(iter(samples), max_staleness, buffered)

    @contextlib.asynccontextmanager
    async def _stream(
        self, samples: Iterator[Sample], max_staleness: int, max_buffered: int
    ) -> AsyncIterator[RolloutStream]:
        prof = self.loop.llm.prof
        rollouts = RolloutStream(
            max_staleness=max_staleness,
            max_buffered=max_buffered,
            current_step=(lambda: None) if prof is None else (lambda: prof.current_step),
            span=None if prof is None else prof.span,
        )
        running = self.concurrency

        async def work() -> None:
            nonlocal running
            try:
                while True:
                    await rollouts._wait_for_room()
                    sample = next(samples, None)  # the workers share one iterator
                    if sample is None:
                        return
                    rollouts._put(await self._rollout(sample))
            finally:
                running -= 1
                if running == 0:
                    rollouts._exhaust()

        failure: Exception | None = None
        async with asyncio.TaskGroup() as group:
            workers = [group.create_task(work()) for _ in range(self.concurrency)]
            try:
                yield rollouts
            except Exception as exc:  # re-raised as it is, not inside an ExceptionGroup
                failure = exc
            finally:
                for worker in workers:
                    worker.cancel()
        if failure is not None:
            raise failure

    async def _rollout(self, sample: Sample) -> Trajectory:
        prof = self.loop.llm.prof
        step = None if prof is None else prof.current_step  # staleness counts from the start
        try:
            return await self.loop.run(sample)
        except Exception as exc:  # a broken loop fails its rollout, not the batch
            _log.exception("agent loop raised", trajectory=sample.id)
            return Trajectory(sample=sample, step=step, error=exc)


class RolloutStream:
    """Finished trajectories of a fully-async rollout, handed over by :meth:`take`."""

    def __init__(
        self,
        *,
        max_staleness: int,
        max_buffered: int,
        current_step: Callable[[], int | None],
        span: SpanFactory | None = None,
    ) -> None:
        """``span``: the profiler's ``span``, for the staleness of what :meth:`take` hands
        over (``None``: nothing recorded)."""
        self.max_staleness = max_staleness
        self.max_buffered = max_buffered
        self.dropped = 0
        """Trajectories dropped as too stale."""
        self._current_step = current_step
        self._span = span
        self._ready: deque[Trajectory] = deque()
        self._arrived = asyncio.Event()  # a trajectory finished, or the samples ran out
        self._room = asyncio.Event()  # the buffer has room
        self._room.set()
        self._exhausted = False

    @property
    def exhausted(self) -> bool:
        """Every sample has been rolled out (only for a finite sample source)."""
        return self._exhausted

    @property
    def buffered(self) -> int:
        """Finished trajectories waiting to be taken."""
        return len(self._ready)

    async def take(self, k: int, *, timeout_s: float = 300.0) -> list[Trajectory]:
        """The next ``k`` finished trajectories that are fresh enough, oldest first.

        Fewer only once the samples ran out. Raises ``TimeoutError`` after ``timeout_s``;
        what was finished by then stays for the next call.

        In a step ``now`` of a profiler, each trajectory handed over whose rollout began in a
        step records, in the caller's (the event loop's) thread, a zero-length timeline span
        ``trajectory`` with ``staleness=now - trajectory.step`` and ``sample``: the report
        counts it in step ``now``. Within ``0..max_staleness`` while steps only go up.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        taken: list[Trajectory] = []
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    # Take as they come: k may be more than the buffer holds.
                    taken = self._fresh(taken)
                    self._ready = deque(self._fresh(list(self._ready)))
                    while self._ready and len(taken) < k:
                        taken.append(self._ready.popleft())
                        self._room.set()
                    if len(taken) == k or (self._exhausted and not self._ready):
                        self._record(taken)
                        return taken
                    self._arrived.clear()
                    await self._arrived.wait()
        except BaseException:
            self._ready.extendleft(reversed(taken))
            raise

    def _record(self, taken: list[Trajectory]) -> None:
        """The staleness of each of ``taken`` with a known step, in the current step."""
        span = self._span
        if span is None or not taken:
            return
        now = self._current_step()
        if now is None:
            return
        for traj in taken:
            if traj.step is not None:
                with span("trajectory", staleness=now - traj.step, sample=traj.sample.id):
                    pass  # zero-length: the span carries its attrs and its step only

    def _fresh(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """``trajectories`` without those too stale for the current step (counted, logged)."""
        now = self._current_step()
        if now is None:
            return trajectories
        fresh = [t for t in trajectories if t.step is None or now - t.step <= self.max_staleness]
        dropped = len(trajectories) - len(fresh)
        if dropped:
            self.dropped += dropped
            self._room.set()
            _log.info("stale trajectories dropped", step=now, count=dropped, total=self.dropped)
        return fresh

    async def _wait_for_room(self) -> None:
        while len(self._ready) >= self.max_buffered:
            self._room.clear()
            await self._room.wait()

    def _put(self, traj: Trajectory) -> None:
        self._ready.append(traj)
        self._arrived.set()

    def _exhaust(self) -> None:
        self._exhausted = True
        self._arrived.set()
