"""Which global steps a run captures, on which targets, and why: the config's steps, and the
steps added while it runs (``aprof capture``, ``prof.capture``, triggers).

Every request is decided here, against the first step not begun yet: a step that has begun is
never added to, so each (step, target) window still starts at most once. A request for a
(step, target) already selected is merged: the answer says so, and the first claim stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from aprof._config import ProfilerConfig, StepSelection
from aprof._control import (
    CaptureAnswer,
    CaptureRequest,
    PlannedStep,
    RequestedBy,
    refusal,
)
from aprof._core.targets import Targets, role_of

MAX_PLANNED: Final = 1000
"""Steps added and not begun yet that a run holds; a request past it is refused."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Why a window of a step exists, and its bound in engine forward steps (rollout)."""

    requested_by: RequestedBy
    forward_steps: int | None = None


@dataclass(slots=True)
class Scope:
    """What one step captures: its rollout replicas and its role targets (by name)."""

    replicas: dict[int, Claim] = field(default_factory=dict)
    roles: dict[str, Claim] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.replicas or self.roles)


class Plan:
    """The steps a run captures; decides every capture request."""

    def __init__(self, config: ProfilerConfig, targets: Targets) -> None:
        self._config = config
        self._steps: StepSelection = config.global_profiler.steps
        self._targets = targets
        self._added: dict[int, Scope] = {}
        """Steps added and not begun, with what each adds."""
        self.first_free = 1
        """The first global step not begun: the earliest a request may name."""

    def begin(self, n: int) -> tuple[Scope | None, list[int]]:
        """Step ``n`` begins: what it captures (``None``: it is not selected; a selected step
        may capture nothing, when no target is registered), and the added steps passed over
        (the run went on past them without entering them)."""
        self.first_free = max(self.first_free, n + 1)
        scope = self._config_scope(n)
        added = self._added.pop(n, None)
        if added is not None:
            for replica, claim in added.replicas.items():
                scope.replicas.setdefault(replica, claim)
            for name, claim in added.roles.items():
                scope.roles.setdefault(name, claim)
        passed = [s for s in self._added if s < n]
        for s in passed:
            del self._added[s]
        selected = n in self._steps or added is not None
        return (scope if selected else None), passed

    def forget(self, name: str, replica: int | None) -> None:
        """The target ``name`` (of ``replica``, a rollout target's) is removed: no step added
        and not begun captures it any more."""
        for scope in self._added.values():
            scope.roles.pop(name, None)
            if replica is not None:
                scope.replicas.pop(replica, None)

    def continues(self, n: int, target: str) -> bool:
        """Step ``n`` (not begun) captures role target ``target``."""
        if n in self._steps and target in self._config_roles():
            return True
        added = self._added.get(n)
        return added is not None and target in added.roles

    def planned(self) -> list[PlannedStep]:
        """The steps added and not begun, in order."""
        out = []
        for n in sorted(self._added):
            scope = self._added[n]
            names = [self._replica_name(r) for r in sorted(scope.replicas)] + list(scope.roles)
            claims = [*scope.replicas.values(), *scope.roles.values()]
            by = sorted({claim.requested_by for claim in claims})
            out.append(PlannedStep(step=n, targets=names, requested_by=by))
        return out

    def decide(self, request: CaptureRequest, requested_by: RequestedBy) -> CaptureAnswer:
        """Accept ``request`` (adding what it asks that is not selected yet) or refuse it,
        all or nothing."""
        first = self.first_free

        def refuse(reason: str) -> CaptureAnswer:
            return refusal(request.id, reason, requested_by=requested_by, decided_at=first)

        if request.steps is not None:
            steps = request.steps
            begun = [n for n in steps if n < first]
            if begun:
                shown = str(StepSelection(explicit=tuple(begun)))
                return refuse(f"step(s) {shown} began already; the first step not begun is {first}")
        else:
            assert request.next is not None
            steps = list(range(first, first + request.next))
        new_steps = [n for n in steps if n not in self._added]
        if len(self._added) + len(new_steps) > MAX_PLANNED:
            return refuse(f"the run holds {MAX_PLANNED} added steps at most; wait for some")
        scope = self._scope_of(request)
        if isinstance(scope, str):
            return refuse(scope)
        replicas, roles = scope
        forward = request.forward_steps
        if forward is not None and not replicas:
            return refuse("forward_steps bounds rollout windows, and no replica is chosen")
        if forward is None and replicas:
            forward = self._config.rollout.forward_steps
        merged: list[str] = []
        for n in steps:
            config = self._config_scope(n)
            added = self._added.get(n) or Scope()
            already: list[str] = []
            for r in replicas:
                prior = config.replicas.get(r) or added.replicas.get(r)
                if prior is None:
                    added.replicas[r] = Claim(requested_by, forward)
                else:
                    already.append(f"{self._replica_name(r)} ({prior.requested_by})")
            for name in roles:
                prior = config.roles.get(name) or added.roles.get(name)
                if prior is None:
                    added.roles[name] = Claim(requested_by)
                else:
                    already.append(f"{name} ({prior.requested_by})")
            if already:
                merged.append(f"step {n}: {', '.join(already)}")
            if added:
                self._added[n] = added
        targets = [self._replica_name(r) for r in replicas] + roles
        return CaptureAnswer(
            id=request.id,
            accepted=True,
            requested_by=requested_by,
            steps=steps,
            targets=targets,
            forward_steps=forward if replicas else None,
            merged=merged,
            decided_at=first,
        )

    def _scope_of(self, request: CaptureRequest) -> tuple[list[int], list[str]] | str:
        """The replicas and role targets ``request`` names (all when it names neither), or
        why it cannot have them."""
        targets = self._targets
        everything = request.replicas is None and request.roles is None
        replicas: list[int] = []
        if request.replicas is not None:
            missing = [r for r in request.replicas if r not in targets.by_replica]
            if missing:
                have = ",".join(map(str, sorted(targets.by_replica))) or "none"
                return (
                    f"no target serves replica(s) {','.join(map(str, missing))} "
                    f"(replicas with a target: {have})"
                )
            replicas = sorted(request.replicas)
        elif everything:
            replicas = sorted(targets.by_replica)
        roles: list[str] = []
        if request.roles is not None:
            for role in request.roles:
                found = [
                    m.target
                    for m in targets.by_name.values()
                    if m.target.kind == "role" and role_of(m.target) == role
                ]
                if not found:
                    known = {
                        role_of(m.target)
                        for m in targets.by_name.values()
                        if m.target.kind == "role"
                    }
                    return (
                        f"no target of role {role!r} (roles with a target: "
                        f"{', '.join(sorted(known)) or 'none'})"
                    )
                chosen = [t.name for t in found if targets.role_selected(t)]
                if not chosen:
                    return (
                        f"roles.{role} is missing, disabled or selects none of its ranks: "
                        "its workers have no capture set up"
                    )
                roles.extend(chosen)
        elif everything:
            roles = self._config_roles()
        if not replicas and not roles:
            return "the run has no capture target to capture"
        return replicas, roles

    def _replica_name(self, replica: int) -> str:
        return self._targets.by_replica[replica].target.name

    def _config_roles(self) -> list[str]:
        return [m.target.name for m in self._targets.selected_roles()]

    def _config_scope(self, n: int) -> Scope:
        """What the config selects of step ``n``."""
        if n not in self._steps:
            return Scope()
        forward = self._config.rollout.forward_steps
        return Scope(
            replicas={r: Claim("config", forward) for r in self._targets.selected_replicas()},
            roles={name: Claim("config") for name in self._config_roles()},
        )
