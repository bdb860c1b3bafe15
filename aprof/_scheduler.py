"""The profiler: which windows each global step opens, and when they start and stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Literal

import structlog

from aprof._capture import CaptureTarget, Window
from aprof._config import ProfilerConfig, load_config
from aprof._errors import CaptureError, ConfigError
from aprof._layout import OutputLayout, check_name, safe_name
from aprof._logging import configure_logging, logger
from aprof._manifest import (
    Clock,
    ForwardSteps,
    Manifest,
    Note,
    StopReason,
    TimelineFile,
    WindowRecord,
)
from aprof._manifest_files import ManifestFiles
from aprof._sharing import Link, RemotePhase, Report, RolloutView
from aprof._state_machine import Phase, TargetMachine, WindowRun
from aprof._timeline.events import AttrValue, now_ns
from aprof._timeline.recorder import BACKEND, NULL_SPAN, Gate, NullSpan, Request, Span
from aprof._timeline.timeline import Timeline

_FAILED = ("failed", "timeout")


class Profiler:
    """Opens, starts and stops the captures of the selected global steps, exactly once each.

    Use it as ``async with Profiler(cfg) as prof:``; inside, ``async with prof.step(n):``
    for each global step and ``async with prof.request(replica=r):`` around each request;
    ``prof.span(name, **attrs)`` records turns and tool calls on the timeline.
    """

    def __init__(
        self, config: ProfilerConfig | Mapping[str, object] | str | os.PathLike[str] | None = None
    ) -> None:
        self.config = load_config(config)
        """The resolved configuration."""
        if not structlog.is_configured():
            configure_logging(self.config.log.format, self.config.log.level)
        self._layout = OutputLayout(self.config.global_profiler.save_path)
        self._run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        self._manifest = Manifest(
            run_id=self._run_id,
            clock=Clock(wall_ns=time.time_ns(), monotonic_ns=time.monotonic_ns()),
            save_path=str(self._layout.root),
            config=self.config.model_dump(mode="json"),
        )
        self._files = ManifestFiles(
            self._manifest,
            self._layout,
            on_trouble=self._disk_trouble,
            before_write=self._count_requests,
        )
        self._disk_error: str | None = None
        """Why the manifest cannot be written now; no capture starts meanwhile."""
        self._disk_since = 0
        self._not_started = 0
        """Windows not started while the manifest could not be written."""
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="aprof-disk")
        """Makes window folders and sizes their files: one thread, so that many windows at
        once do not crowd the event loop's thread out of the GIL."""
        self._machines: dict[str, TargetMachine] = {}
        self._replicas: dict[int, TargetMachine] = {}
        self._live: dict[tuple[int, str], WindowRun] = {}
        """Windows not ended yet (ended ones live on as their manifest records only)."""
        self._step_rollout: dict[int, WindowRun] = {}
        self._open_roles: dict[str, WindowRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._gate = Gate(self._admit)
        """What requests read as they enter: the step now open, whether it has rollout
        windows, and :meth:`_admit`."""
        self._entered: set[int] = set()
        self._status: Literal["new", "open", "closed"] = "new"
        self._log = logger.bind(run_id=self._run_id)
        timeline = self.config.timeline
        self._timeline = (
            Timeline(
                capacity=timeline.buffer_events,
                root=self._layout.root,
                process=timeline.process or f"driver-{os.getpid()}",
                clock=self._manifest.clock,
            )
            if timeline.enable
            else None
        )
        self._recorder = None if self._timeline is None else self._timeline.recorder
        self._step_began = 0
        self._link: Link | None = None
        """The transport to other processes this profiler is shared with (``aprof.ray``)."""
        self._host = socket.gethostname()
        """This machine, as the manifest names it beside each timeline file."""
        self._own_timeline: list[TimelineFile] = []
        self._remote_timeline: dict[str, list[TimelineFile]] = {}
        """Other processes' timeline files, by process, as they last reported them."""

    # -- public API -------------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The live manifest of this run, with the windows of its latest steps (all of them
        until it holds 2,000; ``aprof.load_manifest(save_path)`` reads every one back)."""
        return self._manifest

    @property
    def save_path(self) -> Path:
        """The absolute folder everything of this run is written into."""
        return self._layout.root

    @property
    def current_step(self) -> int | None:
        """The global step now open, if any."""
        return self._gate.step

    def add_target(self, target: CaptureTarget) -> None:
        """Register a capture target; raises ``ValueError`` if it breaks the protocol's rules."""
        if not isinstance(target, CaptureTarget):
            raise TypeError(f"{target!r} is not an aprof.CaptureTarget")
        name = check_name(target.name, "target name")
        if name in self._machines:
            raise ValueError(f"a target named {name!r} is already registered")
        rank = getattr(target, "rank", None)
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise ValueError(f"target {name!r} has rank {rank!r}; use an integer >= 0 or None")
        if self._status == "closed":
            raise RuntimeError("the profiler is closed")
        if target.kind == "rollout":
            replica = target.replica
            if not isinstance(replica, int) or isinstance(replica, bool) or replica < 0:
                raise ValueError(f"rollout target {name!r} needs replica >= 0, got {replica!r}")
            if replica in self._replicas:
                other = self._replicas[replica].target.name
                raise ValueError(f"replica {replica} is already served by target {other!r}")
        elif target.kind == "role":
            role = _role_of(target)
            check_name(role, "role name")
            if not self._role_selected(target):
                self._log.warning(
                    "role target will not be captured",
                    target=name,
                    role=role,
                    why=f"roles.{role} is missing, disabled or does not select its rank",
                )
        else:
            raise ValueError(f"target {name!r} has kind {target.kind!r}; use 'rollout' or 'role'")
        machine = TargetMachine(
            target,
            timeouts=self.config.timeouts,
            limits=self.config.limits,
            layout=self._layout,
            disk=self._disk,
            on_change=self._changed,
            on_note=self._note,
        )
        self._machines[name] = machine
        if target.kind == "rollout":
            assert target.replica is not None
            self._replicas[target.replica] = machine

    def step(self, n: int) -> _Step:
        """The context of global step ``n`` (1-based): opens and closes that step's windows."""
        return _Step(self, n)

    def request(self, *, replica: int, request_id: str | None = None) -> Request:
        """The context of one request to ``replica``: gate, count, and report what happened."""
        return Request(self._gate, self._recorder, replica, request_id)

    def span(self, name: str, /, **attrs: AttrValue) -> Span | NullSpan:
        """A timeline span named ``name`` (a turn, a tool call), for ``with`` or ``async with``.

        ``attrs`` become the span's args; the current step is added. A no-op when
        ``timeline.enable`` is false.
        """
        if self._recorder is None:
            return NULL_SPAN
        return Span(self._recorder, name, attrs, self._gate.step)

    async def flush(self) -> None:
        """Write the manifest and the timeline recorded so far, and wait until both are on
        disk (at most ``timeouts.stop_s``).

        Every change and every step end writes them without waiting; call this before
        reading them back during the run, or now and then in a run without steps. Write
        errors are logged, never raised.
        """
        if self._timeline is not None:
            await self._timeline.write_now()
            self._timeline_written()
        await self._files.flush(self.config.timeouts.stop_s)

    async def __aenter__(self) -> Profiler:
        if self._status != "new":
            raise RuntimeError("a Profiler is opened once")
        try:
            self._layout.check_writable()
        except OSError as exc:
            raise ConfigError(
                "global_profiler.save_path",
                f"cannot write to {self._layout.root}: {exc.strerror or exc}",
            ) from None
        self._status = "open"
        self._files.open()
        self._log.info(
            "profiler open",
            save_path=str(self._layout.root),
            steps=str(self.config.global_profiler.steps),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every open window and wait for all stops (bounded), then write the manifest."""
        if self._status != "open":
            self._status = "closed"
            return
        try:
            if self._gate.step is not None:
                self._leave_step_now(self._gate.step, "run_end")
            for run in list(self._open_roles.values()):
                self._close(run, "run_end")
            self._open_roles.clear()
            await self._wait(self._tasks, self._bound())
            if self._link is not None:
                await self._link.aclose()
            for machine in self._machines.values():
                try:
                    await machine.aclose()
                except Exception as exc:  # TimeoutError included; closing must go on
                    self._log.warning(
                        "target close failed", target=machine.target.name, error=repr(exc)
                    )
        finally:
            for run in list(self._live.values()):
                if run.phase is not Phase.ENDED:
                    run.phase = Phase.ENDED
                    run.record.state = "timeout"
                    run.record.error = "did not finish before the profiler closed"
                    self._files.changed(run.window.step)
            self._live.clear()
            self._status = "closed"
            try:
                if self._timeline is not None:
                    await self._timeline.aclose()
                    self._timeline_written()
            finally:
                # The run's last word: as long as a window may take to end, a slow disk too.
                await self._files.aclose(self._bound())
                self._disk.shutdown(wait=False)
            counts: dict[str, int] = {}
            for record in self._manifest.windows:
                counts[record.state] = counts.get(record.state, 0) + 1
            self._log.info("profiler closed", windows=counts)

    # -- steps ------------------------------------------------------------------------------

    async def _enter_step(self, n: int) -> None:
        if self._status != "open":
            raise RuntimeError("open the profiler first: `async with prof:`")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"global steps are integers >= 1, got {n!r}")
        if self._gate.step is not None:
            raise RuntimeError(f"step {n} entered while step {self._gate.step} is open")
        cfg = self.config
        selected = n in cfg.global_profiler.steps
        self._step_began = now_ns()
        for name, run in list(self._open_roles.items()):
            machine = self._machines[name]
            continues = self._continuous(machine.target) and selected and run.last_step == n - 1
            if not (continues and self._role_selected(machine.target)):
                self._close(run, "step_end")
                del self._open_roles[name]
        self._gate.step = n
        if selected and n in self._entered:
            self._note(n, None, f"step {n} entered again: its windows were captured before")
        elif selected:
            self._entered.add(n)
            await self._open_step(n)
        if self._link is not None:
            self._link.changed()
            await self._link.entered(n)

    async def _open_step(self, n: int) -> None:
        """Open the windows of selected step ``n`` and wait for those it waits for."""
        cfg = self.config
        try:
            if self._disk_error is not None:  # has the disk come back? (told before this returns)
                await self._files.flush(cfg.timeouts.connect_s)
            starting: list[WindowRun] = []
            for name, machine in self._machines.items():
                if machine.target.kind != "role" or not self._role_selected(machine.target):
                    continue
                if name in self._open_roles:
                    self._open_roles[name].last_step = n
                    continue
                opened = self._open_window(machine, n)
                self._open_roles[name] = opened
                starting.append(opened)
            if cfg.rollout.enable:
                self._gate.live = True
                if cfg.rollout.start == "on_step":
                    for replica in sorted(self._replicas):
                        due = self._rollout_run(replica)
                        if due is not None:
                            starting.append(due)
            # A role window must see its step from the beginning, so the step waits for it,
            # behind the target's previous stop if need be; rollout windows gate requests instead.
            roles = {r.start_task for r in starting if r.window.kind == "role" and r.start_task}
            rollouts = {
                r.start_task
                for r in starting
                if r.window.kind == "rollout" and r.phase is Phase.STARTING and r.start_task
            }
            await self._wait(roles, self._bound())
            await self._wait(rollouts, cfg.timeouts.start_s)
            self._raise_if_strict([r for r in starting if r.phase is Phase.ENDED])
        except BaseException as exc:
            await self._leave_step(n, exc)
            raise

    async def _leave_step(self, n: int, exc: BaseException | None) -> None:
        reason: StopReason = (
            "step_end"
            if exc is None
            else "cancelled"
            if isinstance(exc, asyncio.CancelledError)
            else "error"
        )
        rollouts, roles = self._leave_step_now(n, reason)
        cfg = self.config
        waits_for_all = cfg.global_profiler.wait_for_stops or cfg.strict
        try:
            # A role capture still running would record the next step's work: the step ends
            # once its role captures have ended, as it began once they had started.
            stopping = rollouts + roles if waits_for_all else roles
            await self._wait({self._close(run, reason) for run in stopping}, self._bound())
            if waits_for_all and exc is None:
                self._raise_if_strict(rollouts + roles)
        finally:
            if self._timeline is not None:
                self._flush_timeline(self._timeline)

    def _leave_step_now(
        self, n: int, reason: StopReason
    ) -> tuple[list[WindowRun], list[WindowRun]]:
        """Close the windows that end with step ``n``; returns its rollout windows and the
        role windows that end with it."""
        cfg = self.config
        if self._timeline is not None and self._gate.step == n:  # else the close ended it already
            self._timeline.step(n, n in cfg.global_profiler.steps, self._step_began)
        rollouts = list(self._step_rollout.values())
        for run in rollouts:
            self._close(run, reason)
        if self._gate.live:
            for replica, machine in self._replicas.items():
                if replica not in self._step_rollout and cfg.rollout.selects(replica):
                    self._record_skipped(machine, n, f"no request reached replica {replica}")
        self._step_rollout = {}
        self._gate.live = False
        keep = reason == "step_end" and (n + 1) in cfg.global_profiler.steps
        roles: list[WindowRun] = []
        for name, run in list(self._open_roles.items()):
            if keep and self._continuous(self._machines[name].target):
                continue
            self._close(run, reason)
            roles.append(run)
            del self._open_roles[name]
        self._gate.step = None
        if self._link is not None:
            self._link.changed()
        return rollouts, roles

    # -- requests ---------------------------------------------------------------------------

    def _admit(self, req: Request) -> Awaitable[Request] | None:
        """Count ``req`` into its replica's window, for a step with rollout windows
        (``Request`` lets it go itself otherwise): ``None`` if it may go now, else what it
        awaits first, the window's start."""
        run = self._step_rollout.get(req.replica)
        if run is None and self.config.rollout.start == "on_first_request":
            run = self._rollout_run(req.replica)
        if run is None:
            return None
        if run.phase is Phase.ACTIVE:
            run.admitted += 1
            req.captured = True
        elif run.phase is Phase.STARTING:
            req.gated = True
            run.gated += 1
            run.admitted += 1
            return self._after_start(req, run)
        return None

    async def _after_start(self, req: Request, run: WindowRun) -> Request:
        try:
            # Bounded without a timer per request: a starting window's start task is bounded
            # by start_s and sets `started` whatever its outcome (cancellation included).
            await run.started.wait()
            req.captured = run.active
            self._raise_if_strict([run])
        except BaseException as exc:  # no __aexit__ follows a failed __aenter__
            req._end(now_ns(), type(exc).__name__)
            raise
        return req

    def _rollout_run(self, replica: int) -> WindowRun | None:
        """The window of ``replica`` for the current step, opened now if it is due."""
        run = self._step_rollout.get(replica)
        if run is not None:
            return run
        machine = self._replicas.get(replica)
        if machine is None or self._gate.step is None or not self.config.rollout.selects(replica):
            return None
        self._step_rollout[replica] = run = self._open_window(machine, self._gate.step)
        return run

    # -- other processes (a Link: aprof.ray) -------------------------------------------------

    def _rollout_view(self, version: int) -> RolloutView:
        """The open step and where each selected replica's window of it stands."""
        phases: dict[int, RemotePhase] = {}
        if self._gate.live:
            due = self.config.rollout.start == "on_first_request"
            for replica in self._replicas:
                if not self.config.rollout.selects(replica):
                    continue
                run = self._step_rollout.get(replica)
                if run is not None:
                    phases[replica] = _remote_phase(run)
                elif due:
                    phases[replica] = "due"
        return RolloutView(version, self._gate.step, self._gate.live, phases)

    def _open_for(self, step: int, replica: int) -> None:
        """Another process's first request of ``step`` to ``replica``: open its window if it
        is due (as a request of this process would), and tell the others where it stands."""
        on_first_request = self.config.rollout.start == "on_first_request"
        run = None
        if step == self._gate.step and self._gate.live and on_first_request:
            run = self._rollout_run(replica)
        # A window that starts tells the others itself (``_changed``); else tell them here.
        if self._link is not None and (run is None or run.phase is not Phase.STARTING):
            self._link.changed()

    def _take_report(self, process: str, report: Report) -> None:
        """Add what ``process`` counted to its windows, and list its timeline files."""
        for c in report.counts:
            machine = self._replicas.get(c.replica)
            if machine is None:
                continue
            target = machine.target.name
            run = self._live.get((c.step, target))
            if run is not None:
                run.admitted += c.admitted
                run.gated += c.gated
                self._files.changed(c.step)
            elif (record := self._files.window(c.step, target)) is not None:
                counts = record.requests
                counts.admitted, counts.gated = counts.admitted + c.admitted, counts.gated + c.gated
                self._files.changed(c.step)
            elif c.admitted:
                self._note(
                    c.step, target, f"{process}: {c.admitted} request(s) reported too late to count"
                )
            if c.ungated:
                self._note(
                    c.step,
                    target,
                    f"{process}: {c.ungated} request(s) went ahead ungated and uncounted: the "
                    f"driver did not answer within timeouts.start_s",
                )
        if report.timeline:
            self._remote_timeline[process] = [
                TimelineFile.model_validate(e) for e in report.timeline
            ]
            self._list_timeline()

    # -- windows ----------------------------------------------------------------------------

    def _open_window(self, machine: TargetMachine, step: int) -> WindowRun:
        target = machine.target
        cfg = self.config
        if target.kind == "rollout":
            assert target.replica is not None
            folder = self._layout.rollout_dir(step, target.replica)
            delay, forward_steps = cfg.rollout.delay, cfg.rollout.forward_steps
        else:
            folder = self._layout.role_dir(step, _role_of(target), getattr(target, "rank", None))
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
        )
        record = WindowRecord(
            step=step,
            target=target.name,
            kind=target.kind,
            tool=str(getattr(target, "tool", cfg.global_profiler.tool)),
            forward_steps=ForwardSteps(delay=delay, requested=forward_steps),
        )
        run = WindowRun(window=window, record=record, started=asyncio.Event(), last_step=step)
        self._files.add_window(record)
        if self._disk_error is not None:
            self._not_started += 1
            run.started.set()
            run.released.set()
            run.phase = Phase.ENDED
            record.state, record.stop_reason = "failed", "error"
            record.error = f"not started: the manifest cannot be written ({self._disk_error})"
            self._changed(run, "failed", record.error)
            return run
        self._live[(step, target.name)] = run
        machine.open(run)
        return run

    def _record_skipped(self, machine: TargetMachine, step: int, why: str) -> None:
        target = machine.target
        record = WindowRecord(
            step=step,
            target=target.name,
            kind=target.kind,
            tool=str(getattr(target, "tool", self.config.global_profiler.tool)),
            state="skipped",
            stop_reason="step_end",
            forward_steps=ForwardSteps(
                delay=self.config.rollout.delay, requested=self.config.rollout.forward_steps
            ),
        )
        self._files.add_window(record)
        if self._timeline is not None:
            self._timeline.window(record, "skipped")
        self._log.info("window skipped", step=step, target=target.name, why=why)
        self._note(step, target.name, why)

    def _close(self, run: WindowRun, reason: StopReason) -> asyncio.Task[None]:
        task = self._machines[run.window.target].close(run, reason)
        if task not in self._tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return task

    # -- what the state machines report -------------------------------------------------------

    def _changed(self, run: WindowRun, event: str, detail: str | None) -> None:
        """Log a window transition once and have the manifest written."""
        if self._timeline is not None:
            self._timeline.window(run.record, event)
        fields = {} if detail is None else {"detail": detail}
        log = self._log.warning if event in _FAILED else self._log.info
        log(f"window {event}", step=run.window.step, target=run.window.target, **fields)
        if run.phase is Phase.ENDED:
            self._count(run)
            self._live.pop((run.window.step, run.window.target), None)
        if event == "done":
            self._flag_if_large(run)
        self._files.changed(run.window.step)
        if self._link is not None and run.window.kind == "rollout":
            self._link.changed()

    def _note(self, step: int | None, target: str | None, text: str) -> None:
        """Write down something about a window that is not a failure."""
        self._files.add_note(Note(step=step, target=target, text=text))

    def _disk_trouble(self, error: str | None) -> None:
        """The manifest files cannot be written (``error``), or can again (``None``).

        Meanwhile no capture starts and those running are stopped: a capture the manifest
        cannot list would be lost to the reader. Said once on the log each way; when the
        disk takes writes again, the manifest says what was not captured.
        """
        if error is not None:
            if self._disk_error is None:
                self._disk_since, self._not_started = time.time_ns(), 0
                self._log.error(
                    "manifest cannot be written: no capture starts until it can", error=error
                )
                for run in list(self._live.values()):
                    if run.stop_task is None:
                        self._note(
                            run.window.step,
                            run.window.target,
                            f"stopped early: the manifest could not be written ({error})",
                        )
                        self._close(run, "error")
            self._disk_error = error
            return
        if self._disk_error is None:
            return
        since, now = _wall(self._disk_since), _wall(time.time_ns())
        given_up = self._files.take_given_up()
        self._log.warning("manifest written again", not_started=self._not_started)
        lost = f"; step files given up meanwhile: {', '.join(given_up)}" if given_up else ""
        self._note(
            None,
            None,
            f"the manifest could not be written from {since} to {now} ({self._disk_error}): "
            f"{self._not_started} window(s) were not started then and the captures running "
            f"were stopped{lost}",
        )
        self._disk_error = None

    # -- helpers ----------------------------------------------------------------------------

    def _flag_if_large(self, run: WindowRun) -> None:
        total = sum(f.bytes for f in run.record.files)
        limit = self.config.global_profiler.max_window_bytes
        if total > limit:
            self._log.warning(
                "window larger than max_window_bytes", target=run.window.target, bytes=total
            )
            self._note(
                run.window.step,
                run.window.target,
                f"window files total {total} bytes, above max_window_bytes={limit}",
            )

    def _role_selected(self, target: CaptureTarget) -> bool:
        role = self.config.roles.get(_role_of(target))
        if role is None or not role.enable:
            return False
        rank = getattr(target, "rank", None)
        return rank is None or role.selects(rank)

    def _continuous(self, target: CaptureTarget) -> bool:
        """A window of ``target`` spans a run of steps: discrete roles capture per stage."""
        role = self.config.roles.get(_role_of(target))
        return self.config.global_profiler.continuous and not (role is not None and role.discrete)

    def _raise_if_strict(self, runs: list[WindowRun]) -> None:
        if not self.config.strict:
            return
        failed = [r for r in runs if r.record.state in _FAILED and not r.raised]
        for run in failed:
            run.raised = True
        if failed:
            raise CaptureError(
                [(r.window.step, r.window.target, r.record.error or r.record.state) for r in failed]
            )

    def _bound(self) -> float:
        """Longest a window can take to end once asked: its start, a counter read, its stop."""
        t = self.config.timeouts
        return t.start_s + t.connect_s + t.stop_s + 1.0

    @staticmethod
    async def _wait(tasks: set[asyncio.Task[None]], limit_s: float) -> None:
        """Wait for ``tasks`` up to ``limit_s``; the tasks are never cancelled by this wait."""
        if tasks:
            await asyncio.wait(set(tasks), timeout=limit_s)

    def _flush_timeline(self, timeline: Timeline) -> None:
        """Write the timeline in its thread; the step does not wait for it. Once written,
        the manifest's entry for it is brought up to date."""
        written = timeline.flush()
        if written is None:
            return
        loop = asyncio.get_running_loop()

        def update_soon(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._timeline_written)

        written.add_done_callback(update_soon)

    def _timeline_written(self) -> None:
        """Bring the manifest's entries for the timeline's files up to date."""
        timeline = self._timeline
        if timeline is None:
            return
        entries = [
            TimelineFile(
                path=self._layout.relative(path),
                process=timeline.process,
                bytes=written.bytes,
                events=written.events,
                dropped=written.dropped,
                recorder=BACKEND,
                host=self._host,
            )
            for path, written in timeline.files()
        ]
        if entries:
            self._own_timeline = entries
            self._list_timeline()

    def _list_timeline(self) -> None:
        """Bring the manifest's timeline list up to date: this process's files, then the
        others' as they reported them."""
        entries = self._own_timeline + [e for f in self._remote_timeline.values() for e in f]
        if self._manifest.timeline != entries:
            self._manifest.timeline = entries
            self._files.changed(None)

    def _count_requests(self, step: int) -> None:
        """Bring the request counts of ``step``'s windows into their records."""
        for run in self._live.values():
            if run.window.step == step:
                self._count(run)

    @staticmethod
    def _count(run: WindowRun) -> None:
        counts = run.record.requests
        if (counts.admitted, counts.gated) != (run.admitted, run.gated):
            counts.admitted, counts.gated = run.admitted, run.gated


class _Step:
    """``async with prof.step(n):`` — see :meth:`Profiler.step`."""

    __slots__ = ("_n", "_prof")

    def __init__(self, prof: Profiler, n: int) -> None:
        self._prof = prof
        self._n = n

    async def __aenter__(self) -> int:
        await self._prof._enter_step(self._n)
        return self._n

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._prof._leave_step(self._n, exc)


def _remote_phase(run: WindowRun) -> RemotePhase:
    phase = run.phase
    if phase is Phase.QUEUED:
        return "queued"
    if phase is Phase.STARTING:
        return "starting"
    if phase is Phase.ACTIVE:
        return "active"
    started = run.record.started_ns is not None or run.start_task is None
    return "ended" if started else "failed"


def _role_of(target: CaptureTarget) -> str:
    return str(getattr(target, "role", target.name))


def _wall(ns: int) -> str:
    """Wall-clock nanoseconds as local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))
