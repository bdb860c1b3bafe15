"""The capture targets of a profiler: each registered once, with its machine, and what the
config selects of them.

Each target's machine is made by the factory the profiler hands over once the machines'
collaborators are built (:meth:`Targets.make_machines`): the windows they note to, and the
serving side that takes the timelines of a worker group's ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import structlog

from aprof._config import ProfilerConfig
from aprof._core.target_machine import TargetMachine
from aprof._errors import TargetError
from aprof._layout import check_name
from aprof.abc import CaptureTarget


class Targets:
    """Every target of a profiler by name, the rollout ones by replica too."""

    def __init__(
        self,
        config: ProfilerConfig,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._config = config
        self._machine: Callable[[CaptureTarget], TargetMachine] | None = None
        self._log = log
        self.by_name: dict[str, TargetMachine] = {}
        self.by_replica: dict[int, TargetMachine] = {}

    def make_machines(self, machine: Callable[[CaptureTarget], TargetMachine]) -> None:
        """Have ``machine(target)`` make the machine of each target added from now on (called
        once the machines' collaborators are built, before the first :meth:`add`)."""
        self._machine = machine

    def add(self, target: CaptureTarget) -> None:
        """Register ``target``; raises ``TargetError`` if it breaks the protocol's rules."""
        if not isinstance(target, CaptureTarget):
            raise TypeError(f"{target!r} is not an aprof.CaptureTarget")
        name = check_name(target.name, "target name")
        if name in self.by_name:
            raise TargetError(f"a target named {name!r} is already registered")
        rank = getattr(target, "rank", None)
        if rank is not None and not _index(rank):
            raise TargetError(f"target {name!r} has rank {rank!r}; use an integer >= 0 or None")
        if target.kind == "rollout":
            replica = target.replica
            if not _index(replica):
                raise TargetError(f"rollout target {name!r} needs replica >= 0, got {replica!r}")
            if replica in self.by_replica:
                other = self.by_replica[replica].target.name
                raise TargetError(f"replica {replica} is already served by target {other!r}")
        elif target.kind == "role":
            role = role_of(target)
            check_name(role, "role name")
            if not self.role_selected(target):
                self._log.warning(
                    "role target will not be captured",
                    target=name,
                    role=role,
                    why=f"roles.{role} is missing, disabled or does not select its rank",
                )
        else:
            raise TargetError(f"target {name!r} has kind {target.kind!r}; use 'rollout' or 'role'")
        assert self._machine is not None, "make_machines comes before the first add"
        machine = self._machine(target)
        self.by_name[name] = machine
        if target.replica is not None and target.kind == "rollout":
            self.by_replica[target.replica] = machine

    def remove(self, name: str) -> TargetMachine:
        """Unregister the target named ``name``; its machine. Raises ``TargetError`` when no
        target has that name."""
        machine = self.by_name.pop(name, None)
        if machine is None:
            known = ", ".join(map(repr, self.by_name)) or "none"
            raise TargetError(f"no target named {name!r} is registered (targets: {known})")
        replica = rollout_replica(machine.target)
        if replica is not None and self.by_replica.get(replica) is machine:
            del self.by_replica[replica]
        return machine

    def selected_roles(self) -> Iterator[TargetMachine]:
        """The role targets the config captures, in the order they were added."""
        for machine in self.by_name.values():
            if machine.target.kind == "role" and self.role_selected(machine.target):
                yield machine

    def selected_replicas(self) -> list[int]:
        """The replicas with a target that the config captures, in order."""
        rollout = self._config.rollout
        return sorted(r for r in self.by_replica if rollout.selects(r))

    def role_selected(self, target: CaptureTarget) -> bool:
        """The config captures ``target``'s role and rank."""
        role = self._config.roles.get(role_of(target))
        if role is None or not role.enable:
            return False
        rank = getattr(target, "rank", None)
        return rank is None or role.selects(rank)

    def continuous(self, target: CaptureTarget) -> bool:
        """A window of ``target`` spans a run of steps: discrete roles capture per stage."""
        role = self._config.roles.get(role_of(target))
        return self._config.global_profiler.continuous and not (role is not None and role.discrete)

    async def aclose(self) -> None:
        """Release every target's resources; a failure is logged and the others go on."""
        for machine in self.by_name.values():
            try:
                await machine.aclose()
            except Exception as exc:  # TimeoutError included; closing must go on
                self._log.warning(
                    "target close failed", target=machine.target.name, error=repr(exc)
                )


def rollout_replica(target: CaptureTarget) -> int | None:
    """The replica a rollout target serves; ``None`` for a role target."""
    return target.replica if target.kind == "rollout" else None


def tool_of(target: CaptureTarget, default: str) -> str:
    """The tool a target captures with: its ``tool``, else the run's (``default``)."""
    return str(getattr(target, "tool", default))


def role_of(target: CaptureTarget) -> str:
    """The role a target captures: its ``role``, else its name."""
    return str(getattr(target, "role", target.name))


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
