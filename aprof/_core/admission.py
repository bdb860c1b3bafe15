"""Requests entering the open step: each counted into its replica's window, the step's first
request to a replica opening it (``start: on_first_request``), and waiting while it starts.

A request learns what it needs through one object, the :class:`Gate` (the step now open,
whether it has rollout windows, and :meth:`Admission.admit`): the recorder, C or Python, reads
nothing else of the profiler.
"""

from __future__ import annotations

from collections.abc import Awaitable

from aprof._config import ProfilerConfig
from aprof._core.colocation import Colocation
from aprof._core.plan import Claim
from aprof._core.target_machine import TargetMachine
from aprof._core.targets import Targets, rollout_replica
from aprof._core.window_machine import Phase, WindowRun
from aprof._core.windows import Windows
from aprof._manifest import StopReason
from aprof._timeline.events import now_ns
from aprof._timeline.recorder import Gate, Request


class Admission:
    """The rollout windows of the open step, and the gate requests enter through."""

    def __init__(
        self, config: ProfilerConfig, targets: Targets, windows: Windows, colocation: Colocation
    ) -> None:
        self._config = config
        self._targets = targets
        self._windows = windows
        self._colocation = colocation
        self._on_first_request = config.rollout.start == "on_first_request"
        self.gate = Gate(self.admit)
        """What requests read as they enter; its ``active`` holds the tally of each window
        of the open step that is active, so that their requests are counted without a call
        into Python."""
        self.windows: dict[int, WindowRun] = {}
        """This step's rollout windows, by replica."""
        self.replicas: dict[int, Claim] = {}
        """The replicas the open step captures, with why."""
        windows.listen(self._window_moved)

    def begin(self, step: int, replicas: dict[int, Claim]) -> None:
        """Step ``step`` is open and captures ``replicas``."""
        gate = self.gate
        gate.step = step
        gate.first_ns = gate.last_ns = 0
        self.replicas = replicas

    def rollout_s(self) -> float | None:
        """The open step's rollout so far: from its first request's entry to its last
        request's end, in seconds; ``None`` before a request of it has ended."""
        gate = self.gate
        if not gate.first_ns or gate.last_ns < gate.first_ns:
            return None
        return (gate.last_ns - gate.first_ns) / 1e9

    def open_rollouts(self, *, all_now: bool) -> list[WindowRun]:
        """The step has rollout windows: requests are admitted from now on; with ``all_now``
        (``start: on_step``) every selected replica's window opens now, and is returned."""
        self.gate.live = True
        if not all_now:
            return []
        opened = (self.window_of(r) for r in sorted(self.replicas))
        return [run for run in opened if run is not None]

    def end(self, step: int, reason: StopReason) -> list[WindowRun]:
        """Close step ``step``'s rollout windows for ``reason`` and record a skipped one for
        each selected replica no request reached; returns those closed."""
        closed = self.end_rollout(reason)
        self.windows = {}
        self.gate.live = False
        self.gate.step = None
        return closed

    def end_rollout(self, reason: StopReason) -> list[WindowRun]:
        """The open step's rollout is over: close its rollout windows for ``reason`` and
        record a skipped one for each selected replica no request reached; none opens in
        this step any more. Returns those closed (all of the step's, ended before too)."""
        closed = list(self.windows.values())
        self.gate.active.clear()  # asked to stop: no request is captured from now on
        for run in closed:
            self._windows.close(run, reason)
        step = self.gate.step
        if self.gate.live and step is not None:
            for replica, claim in sorted(self.replicas.items()):
                if replica not in self.windows:
                    machine = self._targets.by_replica[replica]
                    before = " before the rollout ended" if reason == "rollout_end" else ""
                    why = f"no request reached replica {replica}{before}"
                    self._windows.skip(machine, step, claim, why, reason=reason)
        self.replicas = {}
        return closed

    def forget(self, machine: TargetMachine) -> list[WindowRun]:
        """``machine``'s rollout target is removed: the open step opens no window of its
        replica any more (one due and not opened is recorded as skipped); its window open
        now, if any, which the step does not close any more."""
        replica = rollout_replica(machine.target)
        if replica is None:
            return []
        run = self.windows.pop(replica, None)
        self.gate.active.pop(replica, None)
        claim = self.replicas.pop(replica, None)
        step = self.gate.step
        if run is None and claim is not None and self.gate.live and step is not None:
            why = f"target removed before a request reached replica {replica}"
            self._windows.skip(machine, step, claim, why, reason="removed")
        return [] if run is None else [run]

    def _window_moved(self, run: WindowRun, phase: Phase) -> None:
        """An active window of the open step counts its requests in the gate (C), until it
        is asked to stop."""
        replica = run.window.replica
        if replica is None or run.window.step != self.gate.step:
            return
        if self.windows.get(replica, run) is not run:  # not yet there: it starts as it opens
            return
        if phase is Phase.ACTIVE and run.stop_task is None:
            self.gate.active[replica] = run.tally
        elif self.gate.active.get(replica) is run.tally:
            del self.gate.active[replica]

    def admit(self, req: Request) -> Awaitable[Request] | None:
        """Count ``req`` into its replica's window (``Request`` lets it go itself outside a
        step with rollout windows): ``None`` if it may go now, else what it awaits first,
        the window's start."""
        run = self.windows.get(req.replica)
        if run is None and self._on_first_request:
            run = self.window_of(req.replica)
        if run is None:
            return None
        if run.admit(req):
            return self._after_start(req, run)
        if run.phase.final:  # its start ended already, as this request opened it (eager.py)
            self._windows.raise_if_strict([run])
        return None

    async def _after_start(self, req: Request, run: WindowRun) -> Request:
        try:
            # Bounded without a timer per request: a starting window's start task is bounded
            # by start_s and sets `started` whatever its outcome (cancellation included).
            await run.started.wait()
            req.captured = run.active
            self._windows.raise_if_strict([run])
        except BaseException as exc:  # no __aexit__ follows a failed __aenter__
            req._end(now_ns(), type(exc).__name__)
            raise
        return req

    def window_of(self, replica: int) -> WindowRun | None:
        """The window of ``replica`` for the open step, opened now if it is due."""
        run = self.windows.get(replica)
        if run is not None:
            return run
        machine = self._targets.by_replica.get(replica)
        claim = self.replicas.get(replica)
        step = self.gate.step
        if machine is None or step is None or claim is None:
            return None
        blocked = self._colocation.blocked(replica)
        if blocked is not None:
            # Skipped, and kept: its requests go ahead ungated, and it is not tried again.
            run = self._windows.skip(machine, step, claim, blocked, reason="colocated")
        else:
            run = self._windows.open(machine, step, claim)
        self.windows[replica] = run
        return run

    def open_for(self, step: int, replica: int) -> WindowRun | None:
        """Another process's first request of ``step`` to ``replica``: its window, opened
        now if it is due, as a request of this process would open it."""
        if step == self.gate.step and self.gate.live and self._on_first_request:
            return self.window_of(replica)
        return None
