"""verl's worker groups under aprof: verl's ``DistProfiler`` stages feed a ``WorkerProfiler``.

verl's workers keep their ``@DistProfiler.annotate`` methods; :func:`profiled_worker` swaps
each worker's ``self.profiler`` for a ``DistProfiler`` that runs those stages in aprof's
``WorkerProfiler``, and :func:`worker_group` lets aprof's driver open and close its windows.
This module imports verl; ``aprof.verl`` loads it on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from verl.single_controller.base.decorator import (
    Dispatch,
    register,
)
from verl.single_controller.base.worker import Worker
from verl.single_controller.ray.base import RayWorkerGroup
from verl.utils.profiler import (
    DistProfiler,
    DistProfilerExtension,
)

from aprof._capture import WorkerCapture, WorkerTimeline
from aprof._config import ConfigSource, load_config
from aprof._errors import UsageError
from aprof._layout import check_name
from aprof._logging import logger
from aprof._workers import LocalWorker, WorkerGroup, WorkerProfiler
from aprof.ray._workers import begin_window, end_window, hand_over

F = TypeVar("F", bound=Callable[..., Any])

INNER_WORKERS = ("actor", "ref", "critic")
"""Attributes where verl's hybrid worker keeps its inner ``TrainingWorker``s, each with its own
``DistProfiler`` (``self.actor.profiler.step()`` runs once per update mini-batch)."""


class _Backend:
    """verl's ``DistProfiler._impl`` over a ``WorkerProfiler``: the calls verl makes on its
    own tools (torch, nsys, npu) become aprof stages and schedule steps."""

    def __init__(self, wp: WorkerProfiler) -> None:
        self._wp = wp
        self._told = False

    def annotate(
        self,
        message: str | None = None,
        color: str | None = None,
        domain: str | None = None,
        category: str | None = None,
        **kwargs: Any,
    ) -> Callable[[F], F]:
        """A decorator running the function (sync or async) as one stage of ``wp``.

        The stage is verl's ``role=`` (``actor_update``), else ``message``, else the
        function's name; verl's other keywords (``color``, ``scheduled``) do not matter here.
        """
        role = kwargs.get("role")

        def wrap(fn: F) -> F:
            name = str(role or message or fn.__name__)
            return cast(F, self._wp.staged(name)(fn))

        return wrap

    def step(self) -> None:
        """One update mini-batch ended (verl's ``profiler.step()``)."""
        self._wp.step()

    def start(self, **kwargs: Any) -> None:
        """verl's trainer starting its own window: aprof's driver owns the windows."""
        self._tell("start_profile")

    def stop(self) -> None:
        """verl's trainer stopping its own window: see :meth:`start`."""
        self._tell("stop_profile")

    def _tell(self, call: str) -> None:
        # verl calls these only when its own profiler is on (aprof.verl.load's overrides
        # turn it off): say so once rather than on every step.
        if not self._told:
            self._told = True
            logger.warning(
                "verl's profiler calls do nothing under aprof: aprof's driver opens and closes "
                "the windows (run verl with aprof.verl.load's overrides)",
                call=call,
                role=self._wp.role,
                rank=self._wp.rank,
            )


class AprofDistProfiler(DistProfiler):  # type: ignore[misc, unused-ignore]
    """verl's ``DistProfiler`` over a ``WorkerProfiler``.

    verl's ``@DistProfiler.annotate`` wrapper asks it whether to profile (enabled rank, inside
    a selected step, or a rank recording its stages) and then runs the method through its
    backend, as with verl's own tools.
    """

    def __init__(self, wp: WorkerProfiler) -> None:
        super().__init__(rank=wp.rank)  # verl's default: a disabled config, a no-op backend
        self.wp = wp
        self._impl = _Backend(wp)

    # A rank that records its stages has every stage run through the backend, profiled
    # step or not: the backend's stage is a timeline span, and a capture's range only
    # inside a selected step.
    def check_enable(self) -> bool:
        return self.wp.enabled or self.wp.records_stages

    def check_this_rank(self) -> bool:
        return self.wp.enabled or self.wp.records_stages

    def check_this_step(self) -> bool:
        return self.wp.current_step is not None or self.wp.records_stages

    def is_discrete_mode(self) -> bool:
        return self.wp.discrete

    def start(self, **kwargs: Any) -> None:
        self._impl.start(**kwargs)

    def stop(self, run_command: bool = True) -> None:
        self._impl.stop()

    def step(self) -> None:
        self._impl.step()

    def run_finish_hook(self, run_command: bool = True) -> None:
        """verl's finish hook (relocate, upload) is verl's profiler's business, not aprof's."""


class AprofWorkerMixin:
    """Mixin of the classes :func:`profiled_worker` makes: after the verl worker's own
    constructor, ``self.profiler`` runs verl's stages in aprof's ``WorkerProfiler``.

    Its ``aprof_begin`` and ``aprof_end`` are verl ``@register`` methods, so verl's worker
    groups bind them, colocated and fused ones included.
    """

    _aprof_config: ClassVar[dict[str, Any]]
    _aprof_role: ClassVar[str]

    if TYPE_CHECKING:
        rank: int
        world_size: int
        profiler: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._aprof_worker: LocalWorker | None = None
        self._aprof_error: str | None = None
        try:
            wp = WorkerProfiler(
                self._aprof_config,
                role=self._aprof_role,
                rank=self.rank,
                world_size=self.world_size,
            )
        except Exception as exc:  # the worker still runs, with verl's own profiler
            self._aprof_error = f"{type(exc).__name__}: {exc}"
            logger.error("aprof worker profiler failed", role=self._aprof_role, error=str(exc))
            return
        self.profiler = AprofDistProfiler(wp)
        self._aprof_worker = LocalWorker(wp)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
    def aprof_begin(self, step: int, rank: int) -> None:
        """Open this worker's window at global step ``step``; ``rank`` is the driver's view."""
        worker = self._aprof_local()
        self._aprof_share_profiler()
        begin_window(worker, step, rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
    def aprof_end(self) -> list[dict[str, Any]]:
        """Close the window; its captures as plain records (``WorkerCapture`` fields)."""
        return end_window(self._aprof_local())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)  # type: ignore[untyped-decorator, unused-ignore]
    def aprof_timeline(self) -> dict[str, Any] | None:
        """This worker's timeline as a plain record (``WorkerTimeline`` fields), if any."""
        return hand_over(self._aprof_local())

    def _aprof_local(self) -> LocalWorker:
        if self._aprof_worker is None:
            raise UsageError(f"aprof's profiler of this worker failed: {self._aprof_error}")
        return self._aprof_worker

    def _aprof_share_profiler(self) -> None:
        """Point the inner TrainingWorkers' profilers at this worker's, so their stages and
        mini-batch steps reach it; they are built after the constructor (``init_model``)."""
        for attr in INNER_WORKERS:
            inner: Any = getattr(self, attr, None)
            found = getattr(inner, "profiler", None)
            if isinstance(found, DistProfiler) and not isinstance(found, AprofDistProfiler):
                inner.profiler = self.profiler


def profiled_worker(worker_cls: type, cfg: ConfigSource, *, role: str) -> type:
    """A subclass of verl worker class ``worker_cls`` whose verl stages feed aprof's ``role``.

    ``cfg`` is aprof's configuration (validated here, carried as plain data to the Ray
    workers); ``roles.<role>`` selects the ranks. Wrap the result in ``ray.remote`` and
    ``RayClassWithInitArgs`` as the class itself. Raises ``TypeError`` when ``worker_cls`` is
    not a verl ``Worker`` with ``DistProfilerExtension``.
    """
    if not isinstance(worker_cls, type):
        hint = " (pass the class, not ray.remote(...))" if _is_ray_class(worker_cls) else ""
        raise TypeError(f"profiled_worker takes a verl worker class, got {worker_cls!r}{hint}")
    missing = [
        base.__name__
        for base in (Worker, DistProfilerExtension)
        if not issubclass(worker_cls, base)
    ]
    if missing:
        raise TypeError(
            f"{worker_cls.__qualname__} is not a verl worker with a DistProfiler: "
            f"{' and '.join(missing)} not in its bases"
        )
    config = load_config(cfg)
    role = check_name(role, "role")
    name = f"Aprof{worker_cls.__name__}"
    namespace = {
        "__module__": worker_cls.__module__,
        "__qualname__": name,
        "__doc__": f"{worker_cls.__qualname__} with its verl stages profiled by aprof as {role!r}.",
        "_aprof_config": config.model_dump(mode="json"),
        "_aprof_role": role,
    }
    return type(name, (AprofWorkerMixin, worker_cls), namespace)


class _VerlWorker:
    """The driver's handle on one worker of a verl group (a ``WorkerHandle``), called through
    verl's own per-worker dispatch; its ``ObjectRef``s are awaited."""

    def __init__(self, wg: Any, worker: Any, rank: int, methods: tuple[str, str, str]) -> None:
        self.rank = rank
        self._wg = wg
        self._worker = worker
        self._begin, self._end, self._timeline = methods

    async def begin(self, step: int) -> None:
        await self._wg._execute_remote_single_worker(
            self._worker, self._begin, step, rank=self.rank
        )

    async def end(self) -> list[WorkerCapture]:
        records: list[dict[str, Any]] = await self._wg._execute_remote_single_worker(
            self._worker, self._end
        )
        return [WorkerCapture.from_record(r) for r in records]

    async def timeline(self) -> WorkerTimeline | None:
        record: dict[str, Any] | None = await self._wg._execute_remote_single_worker(
            self._worker, self._timeline
        )
        return None if record is None else WorkerTimeline.from_record(record)


def worker_group(wg: Any, role: str, cfg: ConfigSource, *, name: str | None = None) -> WorkerGroup:
    """A capture target over the workers of verl ``RayWorkerGroup`` ``wg``, for ``role``.

    ``wg.workers[k]`` is rank ``k``. The class of ``wg``'s workers comes from
    :func:`profiled_worker`; a colocated group is given as the group ``spawn``/``fuse`` made
    for the role. ``cfg`` is the configuration given to :func:`profiled_worker`. Raises
    ``TypeError`` when ``wg`` is not a ``RayWorkerGroup`` or has no aprof methods.
    """
    if not isinstance(wg, RayWorkerGroup):
        raise TypeError(f"worker_group takes a verl RayWorkerGroup, got {type(wg).__name__}")
    methods = (
        _method_name(wg, "aprof_begin"),
        _method_name(wg, "aprof_end"),
        _method_name(wg, "aprof_timeline"),
    )
    handles = [_VerlWorker(wg, w, rank, methods) for rank, w in enumerate(wg.workers)]
    return WorkerGroup(role, handles, cfg, name=name)


def _method_name(wg: Any, method: str) -> str:
    """The name verl's dispatch calls on the workers for ``wg.<method>``.

    verl binds each ``@register`` method to the group as an object whose class is named for
    the worker method it calls: ``actor_aprof_begin`` in a group ``spawn`` made from a
    colocated one, ``aprof_begin`` otherwise (a fused group maps it in its own dispatch).
    """
    bound = getattr(wg, method, None)
    if bound is None:
        raise TypeError(
            f"the worker group has no {method}: make its worker class with "
            "aprof.verl.profiled_worker (for a colocated group, pass the group spawn() made "
            "for the role)"
        )
    called = type(bound).__name__
    return called if called.endswith(method) else method


def _is_ray_class(obj: object) -> bool:
    return hasattr(obj, "__ray_actor_class__")
