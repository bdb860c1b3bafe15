"""Ray actors as engine workers: a profiler inside each actor, a worker group in the driver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aprof._capture import WorkerCapture, WorkerTimeline
from aprof._config import ConfigSource
from aprof._errors import TargetError, UsageError
from aprof._workers import LocalWorker, WorkerGroup, WorkerProfiler


class ProfilerMixin:
    """Mixin for a Ray actor class that profiles one role of an engine worker.

    Call :meth:`init_profiler` in the constructor; ``@aprof.staged`` methods then use
    ``self.profiler``. The driver's :func:`worker_group` calls :meth:`aprof_begin`,
    :meth:`aprof_end` and :meth:`aprof_timeline`. Keep the actor single-threaded (Ray's
    default): a torch capture must start and stop on one thread, and the rank's timeline
    records from one thread.
    """

    profiler: WorkerProfiler
    """This actor's profiler, made by :meth:`init_profiler`."""

    def init_profiler(
        self,
        cfg: ConfigSource,
        *,
        role: str,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> WorkerProfiler:
        """Make ``self.profiler`` for ``role``; ``rank`` must be the actor's index in its group."""
        self.profiler = WorkerProfiler(cfg, role=role, rank=rank, world_size=world_size)
        self._aprof_worker = LocalWorker(self.profiler)
        return self.profiler

    def aprof_begin(self, step: int, *, rank: int) -> None:
        """Open this actor's window at global step ``step``; ``rank`` is the driver's view."""
        begin_window(self._aprof_local(), step, rank)

    def aprof_end(self) -> list[dict[str, Any]]:
        """Close the window; its captures as plain records (``WorkerCapture`` fields)."""
        return end_window(self._aprof_local())

    def aprof_timeline(self) -> dict[str, Any] | None:
        """This actor's timeline as a plain record (``WorkerTimeline`` fields), if it has one."""
        return hand_over(self._aprof_local())

    def _aprof_local(self) -> LocalWorker:
        worker: LocalWorker | None = getattr(self, "_aprof_worker", None)
        if worker is None:
            raise UsageError("call self.init_profiler(...) in the actor's constructor first")
        return worker


def begin_window(worker: LocalWorker, step: int, rank: int) -> None:
    """Open ``worker``'s window at ``step``, once its rank is the one the driver holds."""
    if worker.rank != rank:
        raise TargetError(
            f"the driver holds this actor as rank {rank}, its profiler has rank {worker.rank}"
        )
    worker.begin_step(step)


def end_window(worker: LocalWorker) -> list[dict[str, Any]]:
    """Close ``worker``'s window; its captures as plain records, which cross to the driver."""
    return [c.to_record() for c in worker.end_step()]


def hand_over(worker: LocalWorker) -> dict[str, Any] | None:
    """``worker``'s timeline as a plain record, which crosses to the driver."""
    found = worker.profiler.hand_over_timeline()
    return None if found is None else found.to_record()


class _ActorWorker:
    """The driver's handle on one actor (a ``WorkerHandle``); its refs are awaited."""

    def __init__(self, actor: Any, rank: int) -> None:
        self.actor = actor
        self.rank = rank

    async def begin(self, step: int) -> None:
        await self.actor.aprof_begin.remote(step, rank=self.rank)

    async def end(self) -> list[WorkerCapture]:
        records: list[dict[str, Any]] = await self.actor.aprof_end.remote()
        return [WorkerCapture.from_record(r) for r in records]

    async def timeline(self) -> WorkerTimeline | None:
        record: dict[str, Any] | None = await self.actor.aprof_timeline.remote()
        return None if record is None else WorkerTimeline.from_record(record)


def worker_group(
    role: str, actors: Sequence[Any], cfg: ConfigSource, *, name: str | None = None
) -> WorkerGroup:
    """A capture target over Ray ``actors`` of ``role``, driven from the driver's event loop.

    ``actors[k]`` is rank ``k``: the rank its :meth:`ProfilerMixin.init_profiler` was given.
    ``cfg`` is the configuration the actors got. Raises ``ImportError`` without Ray and
    ``TypeError`` for an actor that is not a Ray actor with :class:`ProfilerMixin`.
    """
    try:
        from ray.actor import ActorHandle
    except ImportError as exc:
        raise ImportError(
            f"aprof.ray.worker_group needs Ray: pip install 'aprof[ray]' ({exc})"
        ) from exc
    for index, actor in enumerate(actors):
        if not isinstance(actor, ActorHandle):
            raise TypeError(f"actors[{index}] is not a Ray actor handle: {actor!r}")
        if not hasattr(actor, "aprof_begin"):
            raise TypeError(
                f"actors[{index}] has no aprof_begin: mix aprof.ray.ProfilerMixin into its class"
            )
    handles = [_ActorWorker(actor, rank) for rank, actor in enumerate(actors)]
    return WorkerGroup(role, handles, cfg, name=name)
