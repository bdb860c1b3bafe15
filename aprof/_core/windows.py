"""The windows of a run: each opened on its target's machine, closed once, and every move told
to the log, the timeline, the manifest and the processes the profiler is shared with."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog

from aprof._capture import Window
from aprof._config import ProfilerConfig
from aprof._core.plan import Claim
from aprof._core.process_timeline import ProcessTimeline
from aprof._core.target_machine import Gate, TargetMachine
from aprof._core.targets import Targets, role_of, tool_of
from aprof._core.window_machine import Phase, WindowRun
from aprof._errors import CaptureError
from aprof._layout import OutputLayout, safe_name
from aprof._manifest import (
    ForwardSteps,
    ManifestFiles,
    Note,
    NoteLevel,
    StopReason,
    WindowRecord,
)

_FAILED = (Phase.FAILED, Phase.TIMEOUT)


class Windows:
    """Opens and closes the windows of one run and keeps those not ended yet."""

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        targets: Targets,
        layout: OutputLayout,
        run_id: str,
        files: ManifestFiles,
        timeline: ProcessTimeline,
        refused: Callable[[], str | None],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._config = config
        self._targets = targets
        self._layout = layout
        self._run_id = run_id
        self._files = files
        self._timeline = timeline
        self._log = log
        self.live: dict[tuple[int, str], WindowRun] = {}
        """Windows not ended yet (ended ones live on as their manifest records only)."""
        self.tasks: set[asyncio.Task[None]] = set()
        """The stops under way."""
        self._refused = refused
        """Why no window may start now (the disk guard's answer), ``None`` when they may."""
        self._listeners: list[Callable[[WindowRun, Phase], None]] = []
        """Told of every move, after the log and the manifest, in the order they listened."""

    def listen(self, listener: Callable[[WindowRun, Phase], None]) -> None:
        """Have ``listener(run, phase)`` told of every window's move from now on."""
        self._listeners.append(listener)

    def open(
        self, machine: TargetMachine, step: int, claim: Claim, gate: Gate | None = None
    ) -> WindowRun:
        """A new window of ``machine``'s target for ``step`` as ``claim`` asks, started now or
        after the target's previous stop and ``gate`` (failed at once when windows may not
        start)."""
        run = self._run(machine, step, claim)
        refused = self._refused()
        if refused is not None:
            run.started.set()
            run.released.set()
            run.end(Phase.FAILED, f"not started: {refused}", reason="error")
            return run
        self.live[(step, machine.target.name)] = run
        machine.open(run, gate)
        return run

    def skip(
        self,
        machine: TargetMachine,
        step: int,
        claim: Claim,
        why: str,
        reason: StopReason = "step_end",
    ) -> WindowRun:
        """Record ``machine``'s window of ``step`` as skipped for ``why``; nothing starts."""
        run = self._run(machine, step, claim)
        run.released.set()
        run.started.set()
        run.end(Phase.SKIPPED, reason=reason, detail=why)
        self.note(step, machine.target.name, why)
        return run

    def _run(self, machine: TargetMachine, step: int, claim: Claim) -> WindowRun:
        """A new window of ``machine``'s target for ``step``, listed in the manifest."""
        target = machine.target
        cfg = self._config
        if target.kind == "rollout":
            assert target.replica is not None
            folder = self._layout.rollout_dir(step, target.replica)
            delay, forward_steps = cfg.rollout.delay, claim.forward_steps
        else:
            folder = self._layout.role_dir(step, role_of(target), getattr(target, "rank", None))
            delay, forward_steps = 0, None
        window = Window(
            step=step,
            target=target.name,
            kind=target.kind,
            delay=delay,
            forward_steps=forward_steps,
            dir=folder,
            prefix=safe_name(f"{target.name}-step{step}-{self._run_id}"),
            root=self._layout.root,
            replica=target.replica if target.kind == "rollout" else None,
        )
        record = WindowRecord(
            step=step,
            target=target.name,
            kind=target.kind,
            tool=tool_of(target, cfg.global_profiler.tool),
            requested_by=claim.requested_by,
            forward_steps=ForwardSteps(delay=delay, requested=forward_steps),
        )
        self._files.add_window(record)
        return WindowRun(window, record, self.changed)

    def close(self, run: WindowRun, reason: StopReason) -> asyncio.Task[None]:
        """Ask ``run`` to end for ``reason`` (once); returns the task that ends it."""
        return self._track(self._targets.by_name[run.window.target].close(run, reason))

    def retire(self, machine: TargetMachine, runs: list[WindowRun]) -> None:
        """``machine``'s target is removed: ``runs`` end (``removed``; a stop is sent only
        for a window whose start succeeded), and the target's resources are released once
        its windows' stops are done (bounded)."""
        name = machine.target.name
        ending = {self._track(machine.close(run, "removed")) for run in runs}
        ending |= {
            run.stop_task
            for (_, target), run in self.live.items()
            if target == name and run.stop_task is not None
        }
        if ending or machine.opened:
            self._track(asyncio.get_running_loop().create_task(self._release(machine, ending)))

    async def _release(self, machine: TargetMachine, ending: set[asyncio.Task[None]]) -> None:
        await wait(ending, self.bound())
        try:
            await machine.aclose()
        except Exception as exc:  # TimeoutError included; the run goes on
            self._log.warning("target close failed", target=machine.target.name, error=repr(exc))

    def _track(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        if task not in self.tasks:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return task

    def changed(self, run: WindowRun, phase: Phase, detail: str | None) -> None:
        """Log a window's move once and have it written (the listener of every window)."""
        window = run.window
        self._timeline.window(run.record, phase.value)
        fields = {} if detail is None else {"detail": detail}
        log = self._log.warning if phase in _FAILED else self._log.info
        log(f"window {phase.value}", step=window.step, target=window.target, **fields)
        if phase.final:
            run.write_counts()
            self.live.pop((window.step, window.target), None)
        if phase is Phase.DONE:
            self._flag_if_large(run)
        self._files.changed(window.step)
        for listener in self._listeners:
            listener(run, phase)

    def note(
        self, step: int | None, target: str | None, text: str, *, level: NoteLevel = "info"
    ) -> None:
        """Write down something about a window, a step or the run: information, unless
        ``level`` says it is a problem."""
        self._files.add_note(Note(step=step, target=target, text=text, level=level))

    def write_counts(self, step: int) -> None:
        """Bring the request counts of ``step``'s live windows into their records."""
        for run in self.live.values():
            if run.window.step == step:
                run.write_counts()

    def raise_if_strict(self, runs: Iterable[WindowRun]) -> None:
        """With ``strict: true``, raise ``CaptureError`` for those of ``runs`` that failed
        (each once)."""
        if not self._config.strict:
            return
        failed = [f for run in runs if (f := run.failure_to_raise()) is not None]
        if failed:
            raise CaptureError(failed)

    def stop_early(self, why: str) -> None:
        """Stop every live window not asked to stop yet, noting ``why`` for each."""
        for run in list(self.live.values()):
            if run.stop_task is None:
                self.note(
                    run.window.step, run.window.target, f"stopped early: {why}", level="problem"
                )
                self.close(run, "error")

    def abandon(self) -> None:
        """End every window still live as timed out: the profiler closes without them."""
        for run in list(self.live.values()):
            if not run.phase.final:
                run.end(Phase.TIMEOUT, "did not finish before the profiler closed")
        self.live.clear()

    def bound(self) -> float:
        """Longest a window can take to end once asked: its start, a counter read, its stop."""
        t = self._config.timeouts
        return t.start_s + t.connect_s + t.stop_s + 1.0

    def _flag_if_large(self, run: WindowRun) -> None:
        total = sum(f.bytes for f in run.record.files)
        limit = self._config.global_profiler.max_window_bytes
        if total > limit:
            self._log.warning(
                "window larger than max_window_bytes", target=run.window.target, bytes=total
            )
            self.note(
                run.window.step,
                run.window.target,
                f"window files total {total} bytes, above max_window_bytes={limit}",
                level="problem",
            )


async def wait(tasks: set[asyncio.Task[None]], limit_s: float) -> None:
    """Wait for ``tasks`` up to ``limit_s``; the tasks are never cancelled by this wait."""
    if tasks:
        await asyncio.wait(set(tasks), timeout=limit_s)
