"""Global steps: entering one opens its windows, leaving it closes them.

A step the plan captures (the config's, or one added while the run goes on) opens a window on
each of its role targets (the step waits until they have started: a role capture must see its
step from the beginning; one whose devices the step's rollout shares starts once that rollout
is over, ``colocation.py``) and makes its rollout windows due; leaving the step closes them,
except the role windows of a continuous run, which go on into the next captured step. At each
boundary the control folder's requests are decided first, and the triggers measure the step
that ended.
"""

from __future__ import annotations

import asyncio
from functools import partial

from aprof._config import ProfilerConfig
from aprof._core.admission import Admission
from aprof._core.colocation import Colocation, Hold
from aprof._core.disk_guard import DiskGuard
from aprof._core.on_demand import Control
from aprof._core.plan import Plan, Scope
from aprof._core.process_timeline import ProcessTimeline
from aprof._core.serving import Serving
from aprof._core.targets import Targets
from aprof._core.window_machine import Phase, WindowRun
from aprof._core.windows import Windows, wait
from aprof._errors import StepError, UsageError
from aprof._manifest import StopReason
from aprof._timeline.events import now_ns


class Steps:
    """The steps of one run, one open at a time."""

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        targets: Targets,
        windows: Windows,
        admission: Admission,
        guard: DiskGuard,
        timeline: ProcessTimeline,
        serving: Serving,
        plan: Plan,
        control: Control,
        colocation: Colocation,
    ) -> None:
        self._config = config
        self._targets = targets
        self._windows = windows
        self._admission = admission
        self._guard = guard
        self._timeline = timeline
        self._serving = serving
        self._plan = plan
        self._control = control
        self._colocation = colocation
        self._profiled = False
        """The open step has windows (it is no trigger's baseline)."""
        self._entered: set[int] = set()
        """Selected steps entered so far (a step entered again opens no window)."""
        self._roles: dict[str, WindowRun] = {}
        """Role windows open, by target: a continuous one outlives its step."""
        self._holds: dict[str, Hold] = {}
        """What the start of each held role window of the open step waits for."""
        self._began = 0

    @property
    def current(self) -> int | None:
        """The global step now open, if any."""
        return self._admission.gate.step

    async def enter(self, n: int) -> None:
        """Open step ``n`` and the windows it selects; raises ``StepError`` for a step that
        is not an integer >= 1 and ``UsageError`` while another step is open."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise StepError(f"global steps are integers >= 1, got {n!r}")
        if self.current is not None:
            raise UsageError(f"step {n} entered while step {self.current} is open")
        self._control.boundary()
        scope, passed = self._plan.begin(n)
        for s in passed:
            self._windows.note(
                s, None, f"step {s} was to be captured, and the run never entered it"
            )
        if scope is not None and n in self._entered:
            self._windows.note(n, None, f"step {n} entered again: its windows were captured before")
            scope = None
        self._profiled = scope is not None
        self._began = now_ns()
        for name, run in list(self._roles.items()):
            target = self._targets.by_name[name].target
            continues = (
                self._targets.continuous(target)
                and scope is not None
                and name in scope.roles
                and run.last_step == n - 1
            )
            if not continues:
                self._windows.close(run, "step_end")
                del self._roles[name]
        self._holds.clear()
        self._admission.begin(n, {} if scope is None else scope.replicas)
        if scope is not None:
            self._entered.add(n)
            await self._open(n, scope)
        self._control.step_began(n)
        self._serving.changed()
        await self._serving.entered(n)

    async def _open(self, n: int, scope: Scope) -> None:
        """Open the windows of step ``n`` and wait for those it waits for."""
        cfg = self._config
        try:
            await self._guard.recheck(cfg.timeouts.connect_s)  # has the disk come back?
            roles: list[WindowRun] = []
            for name, claim in scope.roles.items():
                if name in self._roles:
                    self._roles[name].extend_to(n)
                    continue
                machine = self._targets.by_name[name]
                hold = self._colocation.hold(machine, n, scope.replicas)
                gate = None if hold is None else partial(self._colocation.clear, hold)
                self._roles[name] = run = self._windows.open(machine, n, claim, gate)
                if hold is not None:
                    self._holds[name] = hold
                if hold is None or not hold.deferred:  # else it starts once the rollout is over
                    roles.append(run)
            rollouts = (
                self._admission.open_rollouts(all_now=cfg.rollout.start == "on_step")
                if scope.replicas
                else []
            )
            if scope.replicas and cfg.rollout.start == "on_first_request":
                await self._prepare(n, scope)  # a request meanwhile makes its folder itself
            # A role window must see its step from the beginning, so the step waits for it,
            # behind the target's previous stop if need be; rollout windows gate requests instead.
            await wait({r.start_task for r in roles if r.start_task}, self._windows.bound())
            starting = {
                r.start_task for r in rollouts if r.phase is Phase.STARTING and r.start_task
            }
            await wait(starting, cfg.timeouts.start_s)
            self._windows.raise_if_strict(r for r in roles + rollouts if r.phase.final)
        except BaseException as exc:
            await self.leave(n, exc)
            raise

    async def _prepare(self, n: int, scope: Scope) -> None:
        """Make the folders of step ``n``'s rollout windows ahead (bounded): a window opened
        by a request starts inside that request, where the disk is not waited for."""
        machines = [self._targets.by_replica.get(r) for r in scope.replicas]
        making = {asyncio.ensure_future(m.prepare(n)) for m in machines if m is not None}
        await wait(making, self._config.timeouts.connect_s)

    async def leave(self, n: int, exc: BaseException | None) -> None:
        """Close step ``n`` (ended by ``exc``, if it raised) and the windows that end with it;
        wait (bounded) for its role windows' stops, and for all with ``wait_for_stops``."""
        reason: StopReason = (
            "step_end"
            if exc is None
            else "cancelled"
            if isinstance(exc, asyncio.CancelledError)
            else "error"
        )
        wall_s = (now_ns() - self._began) / 1e9
        rollout_s = self._admission.rollout_s()
        profiled = self._profiled
        rollouts, roles = self.leave_now(n, reason)
        if exc is None:
            self._control.step_ended(n, wall_s, rollout_s, profiled=profiled)
        self._control.read_folder()  # found by the next step's entry
        cfg = self._config
        waits_for_all = cfg.global_profiler.wait_for_stops or cfg.strict
        try:
            # A role capture still running would record the next step's work: the step ends
            # once its role captures have ended, as it began once they had started.
            stopping = rollouts + roles if waits_for_all else roles
            stops = {self._windows.close(run, reason) for run in stopping}
            await wait(stops, self._windows.bound())
            if waits_for_all and exc is None:
                self._windows.raise_if_strict(rollouts + roles)
        finally:
            self._timeline.flush()

    def leave_now(self, n: int, reason: StopReason) -> tuple[list[WindowRun], list[WindowRun]]:
        """Close the windows that end with step ``n``, without waiting; returns its rollout
        windows and the role windows that end with it."""
        if self.current == n:  # else the profiler's close ended it already
            self._timeline.step(n, self._profiled, self._began)
        rollouts = self._admission.end(n, reason)
        for machine in self._targets.by_replica.values():
            machine.unprepare()
        self._colocation.rollout_over(n)
        roles: list[WindowRun] = []
        for name, run in list(self._roles.items()):
            target = self._targets.by_name[name].target
            keep = reason == "step_end" and self._plan.continues(n + 1, name)
            if keep and self._targets.continuous(target):
                continue
            self._windows.close(run, reason)
            roles.append(run)
            del self._roles[name]
        self._serving.changed()
        return rollouts, roles

    def rollout_ended(self) -> None:
        """The open step's rollout is over: its rollout windows end (``rollout_end``), none
        opens again in it, and the role windows held for it go on; nothing outside a step."""
        n = self.current
        if n is None:
            return
        self._admission.end_rollout("rollout_end")
        self._colocation.rollout_over(n)
        self._serving.changed()

    async def roles_started(self) -> None:
        """Wait until the open step's role windows have started, or ended without starting,
        those held for a rollout not yet over aside: a held one waits for the captures on its
        devices to stop first, then starts (bounded by that wait and a start)."""
        starting = {
            run.start_task
            for name, run in self._roles.items()
            if run.start_task is not None
            and not run.start_task.done()
            and (name not in self._holds or self._holds[name].released)
        }
        await wait(starting, self._windows.bound() + self._config.timeouts.start_s)

    def forget(self, name: str) -> list[WindowRun]:
        """The role target ``name`` is removed: its window open now, if any, which no step
        closes any more."""
        self._holds.pop(name, None)
        run = self._roles.pop(name, None)
        return [] if run is None else [run]

    def end_run(self) -> None:
        """The profiler closes: the open step ends, and every role window with it."""
        if self.current is not None:
            self.leave_now(self.current, "run_end")
        for run in self._roles.values():
            self._windows.close(run, "run_end")
        self._roles.clear()
        self._holds.clear()
