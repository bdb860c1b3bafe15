"""One capture target driven through its windows, one at a time: start, poll, stop.

Each window is started at most once and stopped at most once, however many coroutines race to
trigger it; a stop is only sent for a window whose start succeeded, and the next window of the
same target waits for the previous stop to finish. The window's own moves and what they
record are :class:`~aprof._core.window_machine.WindowRun`'s (``window_machine.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from aprof._capture import CaptureResult, CountSource, WorkerTimeline
from aprof._config import LimitsConfig, TimeoutsConfig
from aprof._core.eager import start_task
from aprof._core.window_machine import Captured, Phase, WindowRun
from aprof._errors import describe
from aprof._layout import OutputLayout, size_of
from aprof._manifest import FileEntry, NoteLevel, RankCapture, StopReason
from aprof.abc import CaptureTarget, ManagedTarget

_T = TypeVar("_T")

Gate = Callable[[WindowRun], Awaitable[tuple[StopReason, str] | None]]
"""What a window's start waits for besides its target's previous stop; ``(reason, why)``
when the window is skipped instead (``colocation.py``)."""


class OnNote(Protocol):
    """Told ``(step, target, text)``: something worth writing down about a window;
    information, unless ``level`` says it is a problem."""

    def __call__(self, step: int, target: str, text: str, *, level: NoteLevel = "info") -> None:
        """Write it down."""


@runtime_checkable
class _RankTimelines(Protocol):
    """A target whose ranks keep timelines of their own (a ``WorkerGroup``)."""

    async def timelines(self) -> list[WorkerTimeline]: ...


class TargetMachine:
    """Drives one ``CaptureTarget`` through its windows, one at a time."""

    def __init__(
        self,
        target: CaptureTarget,
        *,
        timeouts: TimeoutsConfig,
        limits: LimitsConfig,
        layout: OutputLayout,
        disk: Executor,
        on_note: OnNote,
        on_timeline: Callable[[WorkerTimeline], None],
    ) -> None:
        """``on_timeline`` is given each timeline a worker group's ranks hand over, after
        each of its windows and as the profiler closes."""
        self.target = target
        self._layout = layout
        self._disk = disk
        self._note = on_note
        self._on_timeline = on_timeline
        self._timeouts = timeouts
        self._limits = limits
        self._previous: WindowRun | None = None
        self._prepared: Path | None = None
        """The folder made ahead for the window of the open step (:meth:`prepare`)."""
        self.opened = False
        """The target's resources are held (see ``ManagedTarget``)."""

    @property
    def polls(self) -> bool:
        """aprof itself must bound this target's windows."""
        return not self.target.enforces_window

    def open(self, run: WindowRun, gate: Gate | None = None) -> None:
        """Begin ``run``: start it now, or once the previous window's stop has finished and
        ``gate`` has let it (skipped when the gate says why not)."""
        previous = self._previous
        if previous is not None and previous.stop_task is None:
            # A window left open when the next one begins is closed first: one at a time.
            self.close(previous, "step_end")
        self._previous = run
        waiting_for = previous.released if previous is not None else None
        if waiting_for is not None and waiting_for.is_set():
            waiting_for = None
        name = f"aprof-start-{run.window.prefix}"
        if waiting_for is None and gate is None:
            run.begin_start()
            # Begun here, inside the request that opened the window: as a task of its own it
            # would wait for every task already ready, a whole wave of agent loops (eager.py).
            run.start_task = start_task(self._start(run, None, None), name=name)
        else:
            run.start_task = asyncio.get_running_loop().create_task(
                self._start(run, waiting_for, gate), name=name
            )

    def close(self, run: WindowRun, reason: StopReason) -> asyncio.Task[None]:
        """Ask ``run`` to end for ``reason``; idempotent, returns the task that ends it."""
        if run.stop_task is None:
            run.ask_stop(reason)
            run.stop_task = asyncio.get_running_loop().create_task(
                self._stop(run), name=f"aprof-stop-{run.window.prefix}"
            )
        return run.stop_task

    async def _start(self, run: WindowRun, after: asyncio.Event | None, gate: Gate | None) -> None:
        # Known before the first step of a start begun at once ends, as after any other.
        run.start_task = asyncio.current_task()
        try:
            if after is not None:
                await after.wait()  # bounded: the previous stop has its own timeout
                if run.stop_task is not None:
                    run.end(Phase.SKIPPED, "window ended before the previous stop finished")
                    return
            if gate is not None:
                try:
                    refused = await gate(run)
                except Exception as exc:  # a failing gate costs its window only
                    if not run.phase.final:
                        self._fail_start(run, Phase.FAILED, f"start failed: {describe(exc)}")
                    return
                if run.phase.final:  # the profiler closed without it
                    return
                if refused is not None:
                    reason, why = refused
                    run.released.set()  # nothing started: the next window need not wait
                    run.end(Phase.SKIPPED, reason=reason, detail=why)
                    self._note(run.window.step, run.window.target, why)
                    return
            if run.phase is Phase.QUEUED:
                run.begin_start()
            try:
                async with asyncio.timeout(self._timeouts.start_s):
                    folder = run.window.dir
                    if folder == self._prepared:
                        self._prepared = None  # made at the step's entry
                    else:
                        try:  # off the event loop: a slow disk must not hold it
                            await self._on_disk(self._layout.make_dir, folder)
                        except OSError as exc:
                            why = f"cannot create {folder}: {exc.strerror or exc}"
                            self._fail_start(run, Phase.FAILED, why)
                            return
                    await self._ensure_open()
                    await self.target.start(run.window)
            except TimeoutError:
                self._fail_start(
                    run, Phase.TIMEOUT, f"start timed out after {self._timeouts.start_s:g}s"
                )
                return
            except Exception as exc:  # a failing target costs its window only
                self._fail_start(run, Phase.FAILED, f"start failed: {describe(exc)}")
                return
            bounded = run.window.forward_steps is not None
            run.activate(("aprof" if self.polls else "server") if bounded else None)
            if (self.polls or bounded) and run.stop_task is None:
                # Its first counter reading begun now: the baseline is the count as the
                # capture became active, before the requests it lets go run.
                run.poll_task = start_task(self._poll(run), name=f"aprof-poll-{run.window.prefix}")
        finally:
            run.started.set()

    async def prepare(self, step: int) -> None:
        """Make the folder of this rollout target's window of ``step`` (the step now
        entered) ahead, so that a start begun inside a request does not wait for the disk; a
        failure is left to the start, which tries again."""
        assert self.target.replica is not None
        folder = self._layout.rollout_dir(step, self.target.replica)
        with contextlib.suppress(OSError):
            await self._on_disk(self._layout.make_dir, folder)
            if not self._uses(folder):  # else a start came first and made it itself
                self._prepared = folder

    def unprepare(self) -> None:
        """The step is over: its folder made ahead goes if no window used it (and it is empty)."""
        folder, self._prepared = self._prepared, None
        if folder is not None and not self._uses(folder):
            with contextlib.suppress(RuntimeError):  # the profiler closed: nothing to tidy
                self._disk.submit(self._remove_empty, folder)

    def _uses(self, folder: Path) -> bool:
        return self._previous is not None and self._previous.window.dir == folder

    def _remove_empty(self, folder: Path) -> None:
        with contextlib.suppress(OSError):  # used meanwhile, or gone: nothing to tidy
            self._layout.remove_empty_dir(folder)

    async def _ensure_open(self) -> None:
        # Windows of one target never start concurrently, so a flag is enough.
        if not self.opened and isinstance(self.target, ManagedTarget):
            await self.target.open(self._timeouts, self._limits)
        self.opened = True

    async def aclose(self) -> None:
        """Take the ranks' last timelines, release the target's resources if it was opened;
        failures are the caller's to log."""
        await self._take_timelines()
        if self.opened and isinstance(self.target, ManagedTarget):
            self.opened = False
            async with asyncio.timeout(self._timeouts.connect_s):
                await self.target.aclose()

    async def _on_disk(self, work: Callable[..., _T], *args: object) -> _T:
        """``work(*args)`` on the profiler's disk thread."""
        return await asyncio.get_running_loop().run_in_executor(self._disk, work, *args)

    def _fail_start(self, run: WindowRun, phase: Phase, error: str) -> None:
        run.released.set()  # no capture runs: the next window need not wait for a stop
        run.end(phase, error, reason="error")

    async def _poll(self, run: WindowRun) -> None:
        """End ``run`` once ``delay + forward_steps`` engine steps have passed, if bounded.

        A target that bounds its windows itself is watched too: once its counter says the
        capture is over, the window stops, so later requests are not taken for captured.
        """
        window = run.window
        run.baseline = await self._read_counter(run)
        if run.baseline is None:
            if window.forward_steps is not None:
                self._lost(run, "target reports no forward-step counter", "info")
            return
        if window.forward_steps is None:
            return
        goal = window.delay + window.forward_steps
        while run.phase is Phase.ACTIVE:  # ends when the window stops or the goal is reached
            await asyncio.sleep(self._timeouts.poll_s)
            count = await self._read_counter(run)
            if count is None:
                self._lost(run, "forward-step counter lost", "problem")
                return
            if count < run.baseline:
                why = (
                    f"forward-step counter went back from {run.baseline} to {count} "
                    "(the server restarted?)"
                )
                self._lost(run, why, "problem")
                return
            if count - run.baseline >= goal:
                self.close(run, "auto_stop")
                return

    def _lost(self, run: WindowRun, why: str, level: NoteLevel) -> None:
        """The counter cannot bound ``run`` (``why``): a target that bounds its windows itself
        still does; else the window runs until its step ends."""
        if self.polls:
            run.unbounded()
            why += ": window runs until the step ends"
        elif level == "info":
            return  # the server ends the capture; nothing went wrong
        else:
            why += ": the server still ends the capture, the window at the step's end"
        self._note(run.window.step, run.window.target, why, level=level)

    async def _read_counter(self, run: WindowRun) -> int | None:
        try:
            async with asyncio.timeout(self._timeouts.connect_s):
                count = await self.target.forward_steps()
        except Exception as exc:  # TimeoutError included
            why = f"forward-step counter: {describe(exc)}"
            self._note(run.window.step, run.window.target, why, level="problem")
            return None
        if count is not None:
            run.last_count = count
        return count

    async def _stop(self, run: WindowRun) -> None:
        try:
            result = await self._stop_target(run)
        finally:
            run.released.set()
        if result is not None:
            await self._record_result(run, result)
            if result.error is None:
                run.end(Phase.DONE)
            else:
                run.end(Phase.FAILED, result.error, reason="error")
        await self._take_timelines()

    async def _take_timelines(self) -> None:
        """Hand the timelines of a worker group's ranks on (the group bounds each rank)."""
        if isinstance(self.target, _RankTimelines):
            for found in await self.target.timelines():
                self._on_timeline(found)

    async def _stop_target(self, run: WindowRun) -> CaptureResult | None:
        """Send the stop of an active window; ``None`` when there was none or it failed."""
        if run.start_task is not None and not run.start_task.done():
            # Only when it runs: even on a finished task, asyncio.wait yields to the event
            # loop, which with thousands of ready tasks delays the next window by a whole pass.
            await asyncio.wait({run.start_task})
        if run.phase is not Phase.ACTIVE:
            return None  # never started: nothing to stop
        if run.poll_task is not None:
            run.poll_task.cancel()
        run.begin_stop()
        if run.baseline is not None and run.record.stop_reason != "auto_stop":
            await self._read_counter(run)
        try:
            async with asyncio.timeout(self._timeouts.stop_s):
                return await self.target.stop(run.window)
        except TimeoutError:
            run.end(Phase.TIMEOUT, f"stop timed out after {self._timeouts.stop_s:g}s")
        except Exception as exc:
            run.end(Phase.FAILED, f"stop failed: {describe(exc)}")
        return None

    async def _record_result(self, run: WindowRun, result: CaptureResult) -> None:
        if result.auto_stopped:
            run.stopped_itself()
        observed, counted_from = self._observed(run, result)
        paths = [self._layout.absolute(Path(p)) for p in result.files]
        if result.host is not None and len(result.sizes) == len(paths):
            sizes = list(result.sizes)  # on the host that holds them
        else:
            sizes = await self._on_disk(lambda: [size_of(p) for p in paths]) if paths else []
        names = [self._layout.relative(p) for p in paths]
        missing = [n for n, size in zip(names, sizes, strict=True) if size is None]
        if missing:
            self._note(
                run.window.step,
                run.window.target,
                f"listed files missing: {', '.join(missing)}"
                + (
                    f" (on host {result.host})"
                    if result.host is not None
                    else " (a server on another node without shared storage keeps its traces "
                    "there: place its target on that node, aprof.ray.placed)"
                ),
                level="problem",
            )
        run.record_result(
            Captured(
                files=[
                    FileEntry(path=n, bytes=size or 0) for n, size in zip(names, sizes, strict=True)
                ],
                captures=[
                    RankCapture.of(c, window_last_step=run.last_step) for c in result.captures
                ],
                observed=observed,
                counted_from=counted_from,
            )
        )
        if result.note:
            self._note(run.window.step, run.window.target, result.note)

    def _observed(
        self, run: WindowRun, result: CaptureResult
    ) -> tuple[int | None, CountSource | None]:
        """The forward steps the window saw and how they were counted: as the target says,
        else from aprof's counter readings; unknown when the counter began again."""
        observed, counted_from = result.forward_steps, result.counted_from
        first, last = run.baseline, run.last_count
        went_back = first is not None and last is not None and last < first
        if went_back or (observed is not None and observed < 0):
            # The counter began again (a restart): any count from it means nothing.
            self._note(
                run.window.step,
                run.window.target,
                f"forward-step counter went back from {first} to {last} during the window "
                "(the server restarted?): observed unknown"
                if went_back
                else f"the target reported {result.forward_steps} forward steps: observed unknown",
                level="problem",
            )
            return None, None
        if observed is None and first is not None and last is not None:
            if not result.error:
                return last - first, "counter"
            return None, counted_from
        if observed is not None and counted_from is None:
            return observed, "counter"  # a target that does not say counts as its counter
        return observed, counted_from
