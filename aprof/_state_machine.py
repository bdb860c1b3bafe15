"""One state machine per capture target: idle -> starting -> active -> stopping -> idle.

A target runs one window at a time. Each window is started at most once and stopped at most
once, however many coroutines race to trigger it; a stop is only sent for a window whose start
succeeded, and the next window of the same target waits for the previous stop to finish.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from aprof._capture import CaptureResult, CaptureTarget, ManagedTarget, Window
from aprof._config import LimitsConfig, TimeoutsConfig
from aprof._errors import describe
from aprof._layout import OutputLayout, size_of
from aprof._manifest import FileEntry, RankCapture, StopReason, WindowRecord


class Phase(enum.Enum):
    """Where one window stands; requests are gated only in ``STARTING``."""

    QUEUED = "queued"
    """Waiting for the target's previous stop to finish."""
    STARTING = "starting"
    ACTIVE = "active"
    STOPPING = "stopping"
    ENDED = "ended"


_T = TypeVar("_T")

OnChange = Callable[["WindowRun", str, "str | None"], None]
"""Told ``(run, event, detail)`` on every window transition; ``event`` names it."""
OnNote = Callable[[int, str, str], None]
"""Told ``(step, target, text)``: something worth writing down that is not a failure."""


@dataclass(eq=False)
class WindowRun:
    """One (step, target) window in flight and its manifest record."""

    window: Window
    record: WindowRecord
    started: asyncio.Event
    """Set when the start is over, whatever its outcome."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the target is free again: the stop call is over, or none was needed."""
    phase: Phase = Phase.QUEUED
    last_step: int = 0
    """The last global step this window covers (continuous role windows grow)."""
    start_task: asyncio.Task[None] | None = None
    stop_task: asyncio.Task[None] | None = None
    poll_task: asyncio.Task[None] | None = None
    baseline: int | None = None
    """The forward-step counter when the capture became active."""
    last_count: int | None = None
    raised: bool = False
    """Its failure already reached a caller (``strict: true``)."""
    admitted: int = 0
    """Requests admitted while the window was starting or active (hot path: a plain int)."""
    gated: int = 0
    """Of those, requests that waited for the start."""

    @property
    def active(self) -> bool:
        """The capture is running and has not been asked to stop."""
        return self.phase is Phase.ACTIVE


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
        on_change: OnChange,
        on_note: OnNote,
    ) -> None:
        self.target = target
        self._layout = layout
        self._disk = disk
        self._changed = on_change
        self._note = on_note
        self._timeouts = timeouts
        self._limits = limits
        self._previous: WindowRun | None = None
        self.opened = False
        """The target's resources are held (see ``ManagedTarget``)."""

    @property
    def polls(self) -> bool:
        """aprof itself must bound this target's windows."""
        return not self.target.enforces_window

    def open(self, run: WindowRun) -> None:
        """Begin ``run``: start it now, or once the previous window's stop has finished."""
        previous = self._previous
        if previous is not None and previous.stop_task is None:
            # A window left open when the next one begins is closed first: one at a time.
            self.close(previous, "step_end")
        self._previous = run
        waiting_for = previous.released if previous is not None else None
        if waiting_for is None or waiting_for.is_set():
            waiting_for = None
            self._enter_starting(run)
        run.start_task = asyncio.get_running_loop().create_task(
            self._start(run, waiting_for), name=f"aprof-start-{run.window.prefix}"
        )

    def close(self, run: WindowRun, reason: StopReason) -> asyncio.Task[None]:
        """Ask ``run`` to end for ``reason``; idempotent, returns the task that ends it."""
        if run.stop_task is None:
            if run.record.stop_reason is None:
                run.record.stop_reason = reason
            run.stop_task = asyncio.get_running_loop().create_task(
                self._stop(run), name=f"aprof-stop-{run.window.prefix}"
            )
        return run.stop_task

    def _enter_starting(self, run: WindowRun) -> None:
        run.phase = Phase.STARTING
        self._changed(run, "starting", None)

    async def _start(self, run: WindowRun, after: asyncio.Event | None) -> None:
        try:
            if after is not None:
                await after.wait()  # bounded: the previous stop has its own timeout
                if run.stop_task is not None:
                    self._end(
                        run, "skipped", error="window ended before the previous stop finished"
                    )
                    return
                self._enter_starting(run)
            try:
                async with asyncio.timeout(self._timeouts.start_s):
                    folder = run.window.dir
                    try:  # off the event loop: a slow disk must not hold it
                        await self._on_disk(self._layout.make_dir, folder)
                    except OSError as exc:
                        why = f"cannot create {folder}: {exc.strerror or exc}"
                        self._fail_start(run, "failed", why)
                        return
                    await self._ensure_open()
                    await self.target.start(run.window)
            except TimeoutError:
                self._fail_start(
                    run, "timeout", f"start timed out after {self._timeouts.start_s:g}s"
                )
                return
            except Exception as exc:  # a failing target costs its window only
                self._fail_start(run, "failed", f"start failed: {describe(exc)}")
                return
            run.phase = Phase.ACTIVE
            run.record.started_ns = time.time_ns()
            if _bounded(run.window):
                run.record.forward_steps.enforced_by = "aprof" if self.polls else "server"
            self._changed(run, "active", None)
            if self.polls and run.stop_task is None:
                run.poll_task = asyncio.get_running_loop().create_task(
                    self._poll(run), name=f"aprof-poll-{run.window.prefix}"
                )
        finally:
            run.started.set()

    async def _ensure_open(self) -> None:
        # Windows of one target never start concurrently, so a flag is enough.
        if not self.opened and isinstance(self.target, ManagedTarget):
            await self.target.open(self._timeouts, self._limits)
        self.opened = True

    async def aclose(self) -> None:
        """Release the target's resources if it was opened; failures are the caller's to log."""
        if self.opened and isinstance(self.target, ManagedTarget):
            self.opened = False
            async with asyncio.timeout(self._timeouts.connect_s):
                await self.target.aclose()

    async def _on_disk(self, work: Callable[..., _T], *args: object) -> _T:
        """``work(*args)`` on the profiler's disk thread."""
        return await asyncio.get_running_loop().run_in_executor(self._disk, work, *args)

    def _fail_start(self, run: WindowRun, state: str, error: str) -> None:
        run.record.stop_reason = "error"
        run.released.set()  # no capture runs: the next window need not wait for a stop
        self._end(run, state, error=error)

    async def _poll(self, run: WindowRun) -> None:
        """Stop ``run`` once ``delay + forward_steps`` engine steps have passed, if bounded."""
        window = run.window
        run.baseline = await self._read_counter(run)
        if run.baseline is None:
            if _bounded(window):
                run.record.forward_steps.enforced_by = "none"
                self._note(
                    window.step,
                    window.target,
                    "target reports no forward-step counter: window runs until the step ends",
                )
            return
        if window.forward_steps is None:
            return
        goal = window.delay + window.forward_steps
        while run.phase is Phase.ACTIVE:  # ends when the window stops or the goal is reached
            await asyncio.sleep(self._timeouts.poll_s)
            count = await self._read_counter(run)
            if count is None:
                run.record.forward_steps.enforced_by = "none"
                self._note(
                    window.step,
                    window.target,
                    "forward-step counter lost: window runs until step end",
                )
                return
            if count < run.baseline:
                run.record.forward_steps.enforced_by = "none"
                self._note(
                    window.step,
                    window.target,
                    f"forward-step counter went back from {run.baseline} to {count} (the "
                    "server restarted?): window runs until step end",
                )
                return
            if count - run.baseline >= goal:
                self.close(run, "auto_stop")
                return

    async def _read_counter(self, run: WindowRun) -> int | None:
        try:
            async with asyncio.timeout(self._timeouts.connect_s):
                count = await self.target.forward_steps()
        except Exception as exc:  # TimeoutError included
            self._note(run.window.step, run.window.target, f"forward-step counter: {describe(exc)}")
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
                self._end(run, "done", error=None)
            else:
                run.record.stop_reason = "error"
                self._end(run, "failed", error=result.error)

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
        run.phase = Phase.STOPPING
        self._changed(run, "stopping", run.record.stop_reason)
        if self.polls and run.baseline is not None and run.record.stop_reason != "auto_stop":
            await self._read_counter(run)
        try:
            async with asyncio.timeout(self._timeouts.stop_s):
                return await self.target.stop(run.window)
        except TimeoutError:
            self._end(run, "timeout", error=f"stop timed out after {self._timeouts.stop_s:g}s")
        except Exception as exc:
            self._end(run, "failed", error=f"stop failed: {describe(exc)}")
        return None

    async def _record_result(self, run: WindowRun, result: CaptureResult) -> None:
        record = run.record
        if result.auto_stopped:
            record.stop_reason = "auto_stop"
        counts = record.forward_steps
        counts.observed, counts.counted_from = result.forward_steps, result.counted_from
        first, last = run.baseline, run.last_count
        went_back = first is not None and last is not None and last < first
        if went_back or (counts.observed is not None and counts.observed < 0):
            # The counter began again (a restart): any count from it means nothing.
            counts.observed = counts.counted_from = None
            self._note(
                run.window.step,
                run.window.target,
                f"forward-step counter went back from {first} to {last} during the window "
                "(the server restarted?): observed unknown"
                if went_back
                else f"the target reported {result.forward_steps} forward steps: observed unknown",
            )
        elif counts.observed is None and first is not None and last is not None:
            if not result.error:
                counts.observed, counts.counted_from = last - first, "counter"
        elif counts.observed is not None and counts.counted_from is None:
            counts.counted_from = "counter"  # a target that does not say counts as its counter
        paths = [self._layout.absolute(Path(p)) for p in result.files]
        sizes = await self._on_disk(lambda: [size_of(p) for p in paths]) if paths else []
        names = [self._layout.relative(p) for p in paths]
        record.files = [
            FileEntry(path=n, bytes=size or 0) for n, size in zip(names, sizes, strict=True)
        ]
        missing = [n for n, size in zip(names, sizes, strict=True) if size is None]
        if missing:
            self._note(
                run.window.step, run.window.target, f"listed files missing: {', '.join(missing)}"
            )
        record.captures = [
            RankCapture.of(c, window_last_step=run.last_step) for c in result.captures
        ]
        if result.note:
            self._note(run.window.step, run.window.target, result.note)

    def _end(self, run: WindowRun, state: str, *, error: str | None) -> None:
        run.phase = Phase.ENDED
        record = run.record
        record.state = state  # type: ignore[assignment]
        record.error = error
        if state != "skipped":
            record.stopped_ns = time.time_ns()
        self._changed(run, state, error)


def _bounded(window: Window) -> bool:
    return window.forward_steps is not None
