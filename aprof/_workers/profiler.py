"""The worker side of role windows: captures per global step or per stage, inside each rank."""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from aprof._accounting import STAGE
from aprof._capture import CaptureFile, WorkerCapture, WorkerTimeline
from aprof._config import ConfigSource, ProfilerConfig, ScheduleConfig, load_config
from aprof._core.process_timeline import open_timeline
from aprof._errors import ConfigError, TargetError
from aprof._layout import OutputLayout, check_name, safe_name, size_of
from aprof._logging import logger
from aprof._safe_files import HeldFolder
from aprof._timeline.recorder import Span

if TYPE_CHECKING:
    from aprof.abc import CaptureTool

CAPTURES_FILE = "captures.json"

HAND_OVER_SHARE = 0.5
"""The share of ``timeouts.stop_s`` a rank waits, as it hands its timeline to the driver, for
the write of what it recorded since the last one (what is not written by then comes next
time): within the bound of the driver's call (``RANK_SHARE``)."""

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(slots=True)
class _Open:
    """The capture in progress."""

    step: int
    last_step: int
    stage: str | None
    dir: Path
    started_ns: int
    label: str
    """Who holds the capture, for the message another profiler gets (``actor step 1``)."""
    error: str | None = None
    """Why the tool did not start; the tool runs only while this is None."""
    step_error: str | None = None
    """Why advancing the schedule failed (the capture still ends normally)."""
    folder: HeldFolder | None = None
    """``dir`` held open for the tool, which writes by name."""
    moved: str | None = None
    """Why ``dir`` is no longer where the capture began (its files are not kept)."""


class _ProcessSlot:
    """The one capture a process may have active, across all its WorkerProfilers.

    Every tool drives process-wide state (torch.profiler, cudaProfilerStart, CUDA memory
    history): a second capture started inside another one corrupts it, or crashes the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: _Open | None = None

    def take(self, capture: _Open) -> _Open | None:
        """Hold the slot for ``capture``; the other holder (and no change) if it is taken."""
        with self._lock:
            if self._holder is not None:
                return self._holder
            self._holder = capture
            return None

    def release(self, capture: _Open) -> None:
        with self._lock:
            if self._holder is capture:
                self._holder = None


_SLOT = _ProcessSlot()


def _release(capture: _Open) -> None:
    """Free the process's slot and the capture's folder."""
    _SLOT.release(capture)
    if capture.folder is not None:
        capture.folder.close()


class WorkerProfiler:
    """Captures of one role in one worker process, for the selected global steps, and the
    rank's trainer stages on its own timeline, in every step.

    Only selected ranks capture and record; on the others every call is a flag check. Tool
    errors fail only the capture they hit (see ``captures``) and never reach the training code.
    """

    def __init__(
        self,
        cfg: ConfigSource,
        *,
        role: str,
        rank: int | None = None,
        world_size: int | None = None,
        tool: CaptureTool | None = None,
    ) -> None:
        """``tool`` replaces the configured capture tool (a custom tool, a test double)."""
        self.config = load_config(cfg)
        self.role = check_name(role, "role")
        self.rank, self.world_size = _rank_and_size(rank, world_size)
        role_cfg = self.config.roles.get(role)
        self._selected = role_cfg is not None and role_cfg.selects(self.rank)
        """The config captures this rank of this role (when a step is captured)."""
        self.enabled = self._selected and not self.config.global_profiler.steps.is_empty
        """True when this rank of this role captures steps of its own config."""
        self.discrete = role_cfg is not None and role_cfg.discrete
        self.captures: list[WorkerCapture] = []
        """Every capture of this process so far, in order."""
        self._in_step: dict[int, list[dict[str, Any]]] = {}
        """The records of ``captures.json`` by step (a step's folder is this role's and
        rank's): a report costs its own captures, not every capture of the run."""
        self._steps = self.config.global_profiler.steps
        self._continuous = self.config.global_profiler.continuous
        self._layout = OutputLayout(self.config.global_profiler.save_path)
        self._tool = tool
        self._step: int | None = None  # the profiled step in progress, None outside one
        self._open: _Open | None = None
        self._stage_calls: dict[str, int] = {}  # discrete captures per stage name in this step
        self._schedule = _schedule_of(self.config)
        self._stepping: CaptureTool | None = None  # the tool of a scheduled capture in progress
        self._global: int | None = None  # the global step in progress, profiled or not
        self._timeline = (
            open_timeline(
                self.config.timeline,
                root=self._layout.root,
                process=f"{self.role}-rank{self.rank}-{os.getpid()}",
            )
            if self._selected
            else None
        )
        """This rank's timeline: its stages in every step (selected ranks, ``timeline.enable``)."""

    @property
    def records_stages(self) -> bool:
        """This rank records its stages on its own timeline, in every step (a selected rank,
        with ``timeline.enable``, and ``save_path`` writable here)."""
        return self._timeline is not None and self._timeline.recorder is not None

    @property
    def current_step(self) -> int | None:
        """The selected global step in progress on a capturing rank; None outside one."""
        return self._step

    # -- global steps ----------------------------------------------------------------------

    @contextmanager
    def global_step(self, step: int) -> Iterator[None]:
        """The window of global step ``step``: captures open and close with it."""
        self.begin_step(step)
        try:
            yield
        finally:
            self.end_step()

    def begin_step(self, step: int) -> None:
        """Global step ``step`` begins (a step capture opens here unless discrete), if the
        config selects it."""
        self._global = step
        if self.enabled:
            self._begin(step, step in self._steps)

    def begin_window(self, step: int) -> None:
        """The driver's window of global step ``step`` begins here: captured as a selected
        step, whether the config selects it or a capture asked for it at run time
        (``aprof capture``, a trigger)."""
        if self._selected:
            self._global = step
            self._begin(step, True)

    def _begin(self, step: int, captured: bool) -> None:
        if self._open is not None and step == self._open.last_step:
            self._step = step  # begun again (by the driver's window, then the rank): one step
            return
        if self._open is not None and step != self._open.last_step + 1:
            self._stop()  # a continuous run broken off: steps skipped or repeated
        if not captured:
            self._step = None
            return
        self._step = step
        if self.discrete:
            self._stage_calls.clear()
            return
        if self._open is None:
            self._start(step, None, f"{self.role}-step{step}-rank{self.rank}")
        else:
            self._open.last_step = step

    def end_step(self) -> None:
        """The current global step ends (a step capture closes unless its run goes on), and
        the stages recorded in it are written."""
        self._global = None
        if self._timeline is not None:
            self._timeline.flush()
        step, self._step = self._step, None
        if step is None or self.discrete or self._open is None:
            return
        if not self._continuous or self._steps.last_of_run(step):
            self._stop()

    def close(self) -> None:
        """End a capture still open (a continuous run cut short by the end of training)."""
        if self._open is not None:
            self._stop()
        self._step = None

    def step(self) -> None:
        """One update mini-batch ended: advances the schedule of the capture in progress.

        Call it after each mini-batch of the update loop. Without a scheduled capture in
        progress it is a flag check.
        """
        tool = self._stepping
        if tool is None:
            return
        self._check_folder(self._open)  # a cycle may be written now
        try:
            tool.step()
        except Exception as exc:  # the schedule stops here; the capture still ends normally
            self._stepping = None
            if self._open is not None:
                self._open.step_error = f"step failed: {type(exc).__name__}: {exc}"
            logger.warning("aprof schedule step failed", role=self.role, error=str(exc))

    # -- stages ------------------------------------------------------------------------------

    def stage(self, name: str) -> _Stage:
        """A stage of the current step: ``with`` or ``async with``; a span on the rank's
        timeline in every step, and in a profiled one a named range of its capture (the
        capture itself when discrete)."""
        if self._step is None and not self.records_stages:
            return _NO_STAGE
        return _Stage(self, name)

    def staged(self, name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorate a function (sync or async) so that each call runs as stage ``name``."""
        return _decorator(name, lambda _args: self)

    def hand_over_timeline(self) -> WorkerTimeline | None:
        """This rank's timeline for the driver: what it recorded is written first (waited
        for up to ``HAND_OVER_SHARE`` of ``timeouts.stop_s``); ``None`` without one."""
        timeline = self._timeline
        if timeline is None or timeline.timeline is None:
            return None
        written = timeline.flush()
        if written is not None:
            wait([written], timeout=HAND_OVER_SHARE * self.config.timeouts.stop_s)
        return WorkerTimeline(
            process=timeline.process,
            files=tuple(timeline.plain_files()),
            ledger=timeline.take_ledger(),
        )

    # -- internals ---------------------------------------------------------------------------

    def _stage_span(self, name: str) -> Span | None:
        """The timeline span of stage ``name``, begun; ``None`` without a timeline."""
        if self._timeline is None or self._timeline.recorder is None:
            return None
        span = Span(
            self._timeline.recorder,
            name,
            {"aprof": STAGE, "role": self.role, "rank": self.rank},
            self._global,
        )
        span.__enter__()
        return span

    def _enter_stage(self, name: str) -> AbstractContextManager[object] | None:
        """Open what stage ``name`` needs; the returned named range must be exited later."""
        step = self._step
        if step is None:
            return None
        opened_here = False
        if self.discrete and self._open is None:
            calls = self._stage_calls[name] = self._stage_calls.get(name, 0) + 1
            # A stage run twice in a step must not overwrite its first trace.
            repeat = f"-call{calls}" if calls > 1 else ""
            self._start(step, name, f"{safe_name(name)}{repeat}-step{step}-rank{self.rank}")
            opened_here = True
        named: AbstractContextManager[object] | None = None
        if self._open is not None and self._open.error is None and self._tool is not None:
            try:
                named = self._tool.stage(name)
                named.__enter__()
            except Exception as exc:  # a missing range must not cost the stage
                logger.warning("aprof stage range failed", stage=name, error=str(exc))
                named = None
        if opened_here:
            return _StopAfter(self, named)
        return named

    def _start(self, step: int, stage: str | None, stem: str) -> None:
        directory = self._layout.role_dir(step, self.role, self.rank)
        label = f"{self.role} step {step}" + (f" stage {stage}" if stage else "")
        current = self._open = _Open(step, step, stage, directory, time.time_ns(), label)
        holder = _SLOT.take(current)
        if holder is not None:
            current.error = (
                f"start failed: another capture is active in this process ({holder.label})"
            )
            return
        try:
            current.folder = HeldFolder(str(self._layout.root), self._layout.parts(directory))
            written_to = Path(current.folder.path)
            if self._tool is None:
                from aprof.tools import make_tool  # imports the tool's framework (torch)

                self._tool = make_tool(self.config)
            schedule = self._schedule
            if schedule is not None and (stage is None or stage in schedule.stages):
                self._tool.start(written_to, stem, scheduled=True)
                self._stepping = self._tool
            else:
                # Tools without a schedule need not take the keyword.
                self._tool.start(written_to, stem)
        except Exception as exc:
            current.error = f"start failed: {type(exc).__name__}: {exc}"
            _release(current)

    def _stop(self) -> None:
        current, self._open = self._open, None
        if current is None:
            return
        self._stepping = None
        paths: list[Path] = []
        note = None
        error = current.error
        if error is None and self._tool is not None:
            self._check_folder(current)  # the trace is written now
            try:
                paths = self._tool.stop()
                note = self._tool.note
            except Exception as exc:
                error = f"stop failed: {type(exc).__name__}: {exc}"
        if current.moved is not None:
            error, paths = f"{current.moved}: the capture's files were not kept", []
        error = error or current.step_error
        held = current.folder.path if current.folder is not None else None
        if held is not None:  # the tool's names of its files, through the held folder
            paths = [
                current.dir / p.relative_to(held) if p.is_relative_to(held) else p for p in paths
            ]
        _release(current)
        record = WorkerCapture(
            step=current.step,
            last_step=current.last_step,
            role=self.role,
            rank=self.rank,
            stage=current.stage,
            tool=self.config.global_profiler.tool,
            state="failed" if error is not None else "done",
            files=tuple(CaptureFile(self._layout.relative(p), size_of(p) or 0) for p in paths),
            error=error,
            note=note,
            started_ns=current.started_ns,
            stopped_ns=time.time_ns(),
        )
        self.captures.append(record)
        self._in_step.setdefault(current.step, []).append(asdict(record))
        if error is not None:
            logger.warning("aprof capture failed", role=self.role, rank=self.rank, error=error)
        self._write_report(current.dir, self._in_step[current.step])

    @staticmethod
    def _check_folder(current: _Open | None) -> None:
        """Before the tool writes: its folder still lies where the capture began, else what
        it writes is thrown away and the capture fails (nothing lands outside save_path)."""
        if current is not None and current.folder is not None and current.moved is None:
            try:
                current.moved = current.folder.check()
            except OSError as exc:  # no descriptor left to check with: never into training
                current.moved = f"{current.dir} could not be checked ({exc.strerror or exc})"

    def _write_report(self, directory: Path, records: list[dict[str, Any]]) -> None:
        try:
            self._layout.write(directory / CAPTURES_FILE, json.dumps(records, indent=1).encode())
        except OSError as exc:  # the in-memory record still reaches the driver
            logger.warning("aprof cannot write captures.json", dir=str(directory), error=str(exc))


class _Stage:
    """A stage, sync or async; the async form runs the same (short) calls in the loop."""

    __slots__ = ("_name", "_profiler", "_range", "_span")

    def __init__(self, profiler: WorkerProfiler | None, name: str) -> None:
        self._profiler = profiler
        self._name = name
        self._range: AbstractContextManager[object] | None = None
        self._span: Span | None = None

    def __enter__(self) -> None:
        if self._profiler is not None:
            self._span = self._profiler._stage_span(self._name)
            self._range = self._profiler._enter_stage(self._name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        named, self._range = self._range, None
        if named is not None:
            try:
                named.__exit__(None, None, None)
            except Exception as error:
                logger.warning("aprof stage end failed", stage=self._name, error=str(error))
        span, self._span = self._span, None
        if span is not None:
            span.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


_NO_STAGE = _Stage(None, "")


class _StopAfter(AbstractContextManager[object]):
    """Ends a discrete capture after its stage's named range."""

    def __init__(
        self, profiler: WorkerProfiler, named: AbstractContextManager[object] | None
    ) -> None:
        self._profiler = profiler
        self._named = named

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._named is not None:
                self._named.__exit__(None, None, None)
        finally:
            self._profiler._stop()


def staged(name: str, *, attr: str = "profiler") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a method (sync or async) to run as stage ``name`` of ``self.<attr>``.

    For worker classes whose profiler is made in the constructor, after the class body.
    """

    def find(args: tuple[Any, ...]) -> WorkerProfiler | None:
        found = getattr(args[0], attr, None) if args else None
        return found if isinstance(found, WorkerProfiler) else None

    return _decorator(name, find)


def _decorator(
    name: str, find: Callable[[tuple[Any, ...]], WorkerProfiler | None]
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(fn):
            async_fn = cast(Callable[P, Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                profiler = find(args)
                async with profiler.stage(name) if profiler is not None else _NO_STAGE:
                    return await async_fn(*args, **kwargs)

            return cast(Callable[P, R], run_async)

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            profiler = find(args)
            with profiler.stage(name) if profiler is not None else _NO_STAGE:
                return fn(*args, **kwargs)

        return run

    return wrap


def _schedule_of(config: ProfilerConfig) -> ScheduleConfig | None:
    """The mini-batch schedule of the configured tool (only torch and npu have one)."""
    tool = config.global_profiler.tool
    if tool == "torch":
        return config.tool_config.torch.schedule
    if tool == "npu":
        return config.tool_config.npu.schedule
    return None


def _rank_and_size(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """From the arguments, else an initialised torch.distributed, else RANK/WORLD_SIZE."""
    # Only a torch the worker already imported can hold a process group: never import it here.
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            found_rank, found_size = int(dist.get_rank()), int(dist.get_world_size())
        else:
            found_rank, found_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
        rank = found_rank if rank is None else rank
        world_size = found_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise TargetError(f"rank {rank} is not within world size {world_size}")
    return rank, world_size


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            name, f"the environment variable {name}={text!r} is not an integer"
        ) from None
