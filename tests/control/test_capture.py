"""``prof.capture(...)`` in one process: what a request adds, what it merges, what is refused
and why; the same through ``BlockingProfiler``; engine workers captured on a step their own
config does not select; the control folder's bounds and hostile places; and exactly-once as a
state machine over requests from people, triggers and the config at once.

Targets are ``aprof.testing.RecordingTarget``; steps end once their captures stopped
(``wait_for_stops``), so a step's windows never queue behind the previous step's stops.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import structlog
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import aprof
from aprof._config import load_config
from aprof._control import CaptureRequest, ControlFolder, bad_field
from aprof._core.plan import Plan
from aprof._core.targets import Targets
from aprof._workers import LocalWorker, WorkerProfiler
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


def _config(make_config: MakeConfig, **sections: Any) -> aprof.ProfilerConfig:
    sections.setdefault("global_profiler", {"steps": [], "wait_for_stops": True})
    sections.setdefault("rollout", {"start": "on_step", "replicas": "all", "forward_steps": 4})
    sections.setdefault("roles", {"actor": {}})
    return make_config(**sections)


def _targets() -> list[RecordingTarget]:
    return [
        RecordingTarget("replica_0", replica=0),
        RecordingTarget("replica_1", replica=1),
        RecordingTarget("actor", kind="role", role="actor"),
    ]


def _windows(prof: aprof.Profiler) -> set[tuple[int, str, str]]:
    return {(w.step, w.target, w.requested_by) for w in prof.manifest.windows}


async def test_next_captures_the_next_steps_everywhere(make_config: MakeConfig) -> None:
    async with aprof.Profiler(_config(make_config)) as prof:
        for target in _targets():
            prof.add_target(target)
        async with prof.step(1):
            answer = prof.capture(next=2)
        for n in (2, 3, 4):
            async with prof.step(n):
                pass
    assert answer.accepted and answer.steps == [2, 3] and answer.decided_at == 2
    assert answer.targets == ["replica_0", "replica_1", "actor"]
    assert answer.forward_steps == 4 and answer.run_id == prof.run_id
    assert _windows(prof) == {
        (n, t, "on_demand") for n in (2, 3) for t in ("replica_0", "replica_1", "actor")
    }
    assert all(w.state == "done" for w in prof.manifest.windows)
    saved = ControlFolder(prof.save_path).answer(answer.id)
    assert saved == answer


async def test_steps_replicas_roles_and_forward_steps_narrow_a_request(
    make_config: MakeConfig,
) -> None:
    async with aprof.Profiler(_config(make_config)) as prof:
        for target in _targets():
            prof.add_target(target)
        only_replica = prof.capture(steps="2", replicas=[1], forward_steps=9)
        only_role = prof.capture(steps=[3], roles=["actor"])
        for n in (1, 2, 3):
            async with prof.step(n):
                pass
    assert only_replica.targets == ["replica_1"] and only_replica.forward_steps == 9
    assert only_role.targets == ["actor"] and only_role.forward_steps is None
    assert _windows(prof) == {(2, "replica_1", "on_demand"), (3, "actor", "on_demand")}
    [rollout] = [w for w in prof.manifest.windows if w.kind == "rollout"]
    assert rollout.forward_steps.requested == 9


async def test_what_is_selected_already_is_merged_and_captured_once(
    make_config: MakeConfig,
) -> None:
    cfg = _config(make_config, global_profiler={"steps": [2], "wait_for_stops": True})
    async with aprof.Profiler(cfg) as prof:
        targets = _targets()
        for target in targets:
            prof.add_target(target)
        first = prof.capture(steps="2-3")
        second = prof.capture(steps=[3], replicas=[0])
        for n in (1, 2, 3):
            async with prof.step(n):
                pass
    assert first.accepted and first.merged == [
        "step 2: replica_0 (config), replica_1 (config), actor (config)"
    ]
    assert second.accepted and second.merged == ["step 3: replica_0 (on_demand)"]
    assert _windows(prof) == {
        *((2, t, "config") for t in ("replica_0", "replica_1", "actor")),
        *((3, t, "on_demand") for t in ("replica_0", "replica_1", "actor")),
    }
    assert [c.step for c in targets[0].starts] == [2, 3]  # each (step, target) started once


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"steps": "1-2"}, "step(s) 1-2 began already; the first step not begun is 3"),
        ({"replicas": [7]}, "no target serves replica(s) 7 (replicas with a target: 0,1)"),
        ({"roles": ["critic"]}, "no target of role 'critic' (roles with a target: actor, ref)"),
        ({"roles": ["ref"]}, "roles.ref is missing, disabled or selects none of its ranks"),
        ({"roles": ["actor"], "forward_steps": 3}, "forward_steps bounds rollout windows"),
    ],
)
async def test_a_request_the_run_cannot_honour_is_refused_with_why(
    make_config: MakeConfig, kwargs: dict[str, Any], reason: str
) -> None:
    async with aprof.Profiler(_config(make_config)) as prof:
        for target in [*_targets(), RecordingTarget("ref", kind="role", role="ref")]:
            prof.add_target(target)
        for n in (1, 2):
            async with prof.step(n):
                pass
        answer = prof.capture(**kwargs)
        async with prof.step(3):
            pass
    assert not answer.accepted and answer.reason is not None
    assert answer.reason.startswith(reason), answer.reason
    assert answer.line() == f"refused: {answer.reason}"
    assert prof.manifest.windows == []


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"next": 0}, "next"),
        ({"next": 1, "steps": [4]}, None),
        ({"steps": "4-2"}, "steps"),
        ({"steps": {"every": 2}}, "steps"),
        ({"replicas": [0, 0]}, "replicas[1]"),
        ({"forward_steps": -1}, "forward_steps"),
        ({"next": 5000}, "next"),
    ],
)
async def test_a_malformed_request_raises_one_config_error(
    make_config: MakeConfig, kwargs: dict[str, Any], key: str | None
) -> None:
    async with aprof.Profiler(_config(make_config)) as prof:
        with pytest.raises(aprof.ConfigError) as caught:
            prof.capture(**kwargs)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("data", "told"),
    [
        (
            {"id": "a", "zzzz": 1},
            "zzzz: unknown key; expected one of 'schema', 'id', 'next', 'steps', 'replicas', "
            "'roles', 'forward_steps'",
        ),
        (
            {"id": "a", "schema_": "aprof.capture-request/1"},
            "schema_: unknown key; did you mean 'schema'?",
        ),
    ],
)
def test_an_unknown_key_is_told_the_keys_as_written(data: dict[str, Any], told: str) -> None:
    """The keys a request is told to use are its JSON keys, not the model's field names."""
    with pytest.raises(aprof.ConfigError) as caught:
        CaptureRequest.parse(data)
    assert bad_field(caught.value) == f"malformed request: {told}"


async def test_capture_on_a_closed_profiler_is_a_usage_error(make_config: MakeConfig) -> None:
    prof = aprof.Profiler(_config(make_config))
    async with prof:
        pass
    with pytest.raises(aprof.UsageError):
        prof.capture()


def test_blocking_profiler_captures_on_demand(make_config: MakeConfig) -> None:
    target = RecordingTarget("replica_0", replica=0)
    with aprof.BlockingProfiler(_config(make_config)) as prof:
        prof.add_target(target)
        with prof.step(1):
            answer = prof.capture()
        with prof.step(2):
            pass
    assert answer.accepted and answer.steps == [2]
    assert [(w.step, w.requested_by, w.state) for w in prof.manifest.windows] == [
        (2, "on_demand", "done")
    ]


class _Tool:
    """A capture tool double (the real torch profiler cannot run twice in one process), with
    ``CaptureTool``'s signatures and call order."""

    name = "torch"
    note: str | None = None

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        self.calls.append(f"start {stem}")

    def stop(self) -> list[Path]:
        self.calls.append("stop")
        return []

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def step(self) -> None:
        pass


async def test_engine_workers_capture_a_step_their_own_config_does_not_select(
    make_config: MakeConfig,
) -> None:
    cfg = _config(make_config)
    tool = _Tool()
    worker = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    assert not worker.enabled  # its config selects no step: alone, it never captures
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(aprof.WorkerGroup("actor", [LocalWorker(worker)], cfg))
        prof.capture(next=1, roles=["actor"])
        async with prof.step(1):
            pass
        async with prof.step(2):
            pass
    assert tool.calls == ["start actor-step1-rank0", "stop"]
    [window] = prof.manifest.windows
    assert (window.step, window.state, window.requested_by) == (1, "done", "on_demand")


async def test_a_linked_control_folder_is_a_problem_and_the_run_goes_on(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    cfg = _config(make_config)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    save_path = cfg.global_profiler.save_path
    save_path.mkdir(parents=True)
    os.symlink(elsewhere, save_path / "control")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in (1, 2, 3):
            async with prof.step(n):
                pass
    # The folder is read in the disk thread; the close waits for the read under way (bounded)
    # and takes in what it found, so the problem is known by then, however the thread ran.
    problems = prof._control.status().problems
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    said = [p for p in problems if "control folder cannot be read" in p]
    assert len(said) == 1 and "link" in said[0], problems  # said once, not at every boundary


async def test_a_flooded_folder_costs_a_few_files_per_boundary(make_config: MakeConfig) -> None:
    cfg = _config(make_config)
    folder = ControlFolder(cfg.global_profiler.save_path)
    for i in range(20):
        folder.submit(CaptureRequest(id=f"r{i:02d}", steps=[100 + i]))
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        planned = [0]
        # Each boundary decides what the disk thread's last finished read found: how many
        # boundaries that takes depends on the thread, so step on (bounded) until all are in.
        for n in range(1, 51):
            async with prof.step(n):
                await prof.flush()
                planned.append(len(prof._control.status().planned))
            if planned[-1] == 20:
                break
    # At most 8 requests are decided per boundary; the rest wait for the next ones.
    assert all(b - a <= 8 for a, b in itertools.pairwise(planned))
    assert planned[-1] == 20


# -- exactly once, as a state machine ---------------------------------------------------------


class _Machine:
    """What ``Targets`` needs of a target's machine: the target."""

    def __init__(self, target: RecordingTarget) -> None:
        self.target = target


class ExactlyOnce(RuleBasedStateMachine):
    """Requests by people and triggers, config steps, steps begun in order: every (step,
    target) is begun at most once, and every accepted one is begun with the run."""

    def __init__(self) -> None:
        super().__init__()
        config = load_config(
            {
                "global_profiler": {"steps": [2, 5]},
                "rollout": {"replicas": "all"},
                "roles": {"actor": {}},
            }
        )
        self.targets = Targets(config, structlog.get_logger())
        self.targets.make_machines(_Machine)  # type: ignore[arg-type]
        for target in _targets():
            self.targets.add(target)
        self.plan = Plan(config, self.targets)
        self.step = 0
        self.begun: list[tuple[int, str]] = []
        self.promised: set[tuple[int, str]] = set()
        self.config_steps = {2, 5}

    @rule(
        next_=st.integers(1, 3),
        replicas=st.none() | st.sampled_from([[0], [1], [0, 1]]),
        by=st.sampled_from(["on_demand", "slow_step", "slow_rollout"]),
    )
    def ask_next(self, next_: int, replicas: list[int] | None, by: Any) -> None:
        answer = self.plan.decide(CaptureRequest(next=next_, replicas=replicas), by)
        assert answer.accepted
        assert answer.steps == list(range(self.step + 1, self.step + 1 + next_))
        self.promised |= {(n, t) for n in answer.steps for t in answer.targets}

    @rule(steps=st.lists(st.integers(1, 12), min_size=1, max_size=3, unique=True))
    def ask_steps(self, steps: list[int]) -> None:
        answer = self.plan.decide(CaptureRequest(steps=steps), "on_demand")
        assert answer.accepted == all(n > self.step for n in steps)
        if answer.accepted:
            self.promised |= {(n, t) for n in answer.steps for t in answer.targets}

    @precondition(lambda self: self.step < 12)
    @rule()
    def begin_next_step(self) -> None:
        self.step += 1
        scope, _ = self.plan.begin(self.step)
        if scope is None:
            return
        names = [f"replica_{r}" for r in scope.replicas] + list(scope.roles)
        self.begun += [(self.step, name) for name in names]

    @invariant()
    def each_window_once(self) -> None:
        assert len(self.begun) == len(set(self.begun))

    @invariant()
    def every_promise_kept(self) -> None:
        begun = set(self.begun)
        due = {(n, t) for n, t in self.promised if n <= self.step}
        assert due <= begun
        config = {
            (n, t)
            for n in self.config_steps
            if n <= self.step
            for t in ("replica_0", "replica_1", "actor")
        }
        assert config <= begun
        assert begun <= due | config


TestExactlyOnce = ExactlyOnce.TestCase
TestExactlyOnce.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
