"""Captures on shared accelerators never run at once: a role's engine workers and the rollout
replicas the config's ``colocated`` puts on their devices, when their captures exclude each
other (``exclusive``; by default when either tool is ``npu`` or ``nsys``: verl #7722 found that
one lost NPU profiler data and broke nsys's GPU metrics).

A role window of such a role is held before its start (:class:`Hold`): first, when its step
captures replicas on its devices, until that step's rollout on them is over (each of their
windows ended, ``prof.rollout_ended()`` was called, or the step ended: the window is then
skipped); then it asks the captures still running on its replicas to stop and waits for them,
as long as a window may take to end, skipping the role window (``stop_reason: colocated``) if
one does not stop. From then until the role's capture has stopped, a rollout window that would
open on its devices is skipped at once: a request never waits for a training capture. The
record of a window that waited says for what and how long (``waited_for``).

The granularity is the role and the replica: every rank of the role shares devices with every
listed replica. Two roles on the same devices are not ordered against each other here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from aprof._config import ColocatedConfig, ProfilerConfig
from aprof._core.target_machine import TargetMachine
from aprof._core.targets import Targets, role_of, tool_of
from aprof._core.window_machine import Phase, WindowRun
from aprof._core.windows import Windows, wait
from aprof._manifest import StopReason


@dataclass
class _Rollout:
    """One step's rollout, as the role windows held for it see it."""

    ended: set[int] = field(default_factory=set)
    """Replicas whose window of the step has ended."""
    over: bool = False
    """``prof.rollout_ended()`` was called, or the step ended."""


@dataclass(frozen=True)
class Hold:
    """What one role window's start waits for (see the module)."""

    machine: TargetMachine
    entry: ColocatedConfig
    due: frozenset[int]
    """The replicas on its devices whose windows its step opens: their rollout goes first."""
    rollout: _Rollout

    @property
    def deferred(self) -> bool:
        """The start waits for its step's rollout: the step does not wait for the start."""
        return bool(self.due)

    @property
    def released(self) -> bool:
        """Its step's rollout on its devices is over: the start goes on."""
        return self.rollout.over or self.due <= self.rollout.ended


class Colocation:
    """The ``colocated`` rule of one run (see the module)."""

    def __init__(self, config: ProfilerConfig, targets: Targets, windows: Windows) -> None:
        self._config = config
        self._targets = targets
        self._windows = windows
        windows.listen(self._window_moved)
        self._steps: dict[int, _Rollout] = {}
        """The rollout of each step a held role window waits on (the open step's)."""
        self._holding: dict[str, tuple[Hold, WindowRun]] = {}
        """Role windows past their hold, by target, until their capture has stopped."""
        self._changed = asyncio.Event()
        """Set, and replaced, when a step's rollout moves on."""

    def hold(self, machine: TargetMachine, step: int, replicas: Iterable[int]) -> Hold | None:
        """The hold of ``machine``'s window of ``step``, which captures ``replicas``;
        ``None`` when its captures exclude none."""
        entry = self._config.colocated_with(role_of(machine.target))
        if entry is None:
            return None
        due = frozenset(r for r in replicas if self._excludes(machine, entry, r))
        return Hold(machine, entry, due, self._steps.setdefault(step, _Rollout()))

    def blocked(self, replica: int) -> str | None:
        """Why a window of ``replica`` may not open now: a role capture on its devices runs."""
        for name, (hold, run) in list(self._holding.items()):
            if run.released.is_set() or run.phase.final:
                del self._holding[name]  # its capture has stopped
            elif self._excludes(hold.machine, hold.entry, replica):
                return f"the capture of {name} (colocated) runs on replica {replica}'s devices"
        return None

    def _window_moved(self, run: WindowRun, phase: Phase) -> None:
        """A rollout window that ended: its step's rollout on its replica may be over."""
        if run.window.kind != "rollout" or not phase.final:
            return
        replica = run.window.replica
        rollout = self._steps.get(run.window.step)
        if replica is not None and rollout is not None:
            rollout.ended.add(replica)
            self._wake()

    def rollout_over(self, step: int) -> None:
        """Step ``step``'s rollout has ended (``prof.rollout_ended()``, or the step ended)."""
        rollout = self._steps.pop(step, None)
        if rollout is not None:
            rollout.over = True
            self._wake()

    async def clear(self, hold: Hold, run: WindowRun) -> tuple[StopReason, str] | None:
        """Wait until ``run`` may start (see the module); ``(reason, why)`` when it may not."""
        began = time.monotonic()
        name = hold.machine.target.name
        due = sorted(hold.due)
        while not hold.released:
            changed = self._changed
            if run.stop_task is not None:
                break
            await changed.wait()
        if run.stop_task is not None:  # its step ended first, or its target was removed
            shown = ", ".join(map(str, due))
            asked = run.record.stop_reason or "step_end"
            if asked != "step_end":
                return asked, f"ended ({asked}) before its step's rollout on replica(s) {shown} did"
            return (
                "step_end",
                f"the step ended before its rollout on replica(s) {shown} did, which shares "
                f"{name}'s devices (prof.rollout_ended() says when it ends)",
            )
        self._holding[name] = (hold, run)
        running = [
            other
            for other in list(self._windows.live.values())
            if (replica := other.window.replica) is not None
            # The window's own tool: its target may have been removed while it stops.
            and self._excludes(hold.machine, hold.entry, replica, other.record.tool)
        ]
        stops = {
            # One asked to stop before (its target removed, say) has its stop under way.
            other.stop_task or self._windows.close(other, "colocated")
            for other in running
        }
        await wait(stops, self._windows.bound())
        waited = sorted({other.window.target for other in running} | {self._name(r) for r in due})
        if waited:
            run.waited(
                waited,
                time.monotonic() - began,
                "they share its devices (colocated): "
                + ("its step's rollout on them ended first, " if due else "")
                + "their captures stopped before it started",
            )
        for other in running:
            why = _still_running(other)
            if why is not None:
                del self._holding[name]
                return "colocated", f"{other.window.target} (step {other.window.step}) {why}"
        if run.stop_task is not None:  # ended while the captures on its devices stopped
            del self._holding[name]
            asked = run.record.stop_reason or "step_end"
            return asked, f"ended ({asked}) before the captures on its devices had stopped"
        return None

    def _excludes(
        self,
        machine: TargetMachine,
        entry: ColocatedConfig,
        replica: int,
        tool: str | None = None,
    ) -> bool:
        """A capture of ``machine``'s role and one of ``replica`` by ``tool`` (by default: its
        target's) may not run at once."""
        default = self._config.global_profiler.tool
        if tool is None:
            rollout = self._targets.by_replica.get(replica)
            if rollout is None:
                return False
            tool = tool_of(rollout.target, default)
        return entry.holds(replica) and entry.excludes((tool_of(machine.target, default), tool))

    def _name(self, replica: int) -> str:
        rollout = self._targets.by_replica.get(replica)
        return f"replica {replica}" if rollout is None else rollout.target.name

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _still_running(run: WindowRun) -> str | None:
    """Why ``run``'s capture may still run after it was asked to stop; ``None`` if it cannot."""
    if not run.released.is_set():
        return "did not stop in time"
    if run.phase is Phase.TIMEOUT or (
        run.phase is Phase.FAILED and run.record.started_ns is not None
    ):
        return f"did not stop cleanly ({run.record.error}): its capture may still run"
    return None
