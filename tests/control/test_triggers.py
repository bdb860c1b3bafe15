"""Triggers: a slow step (or a slow rollout) asks for the next steps' capture, never before
its baseline is full, not again during its cooldown, and a slow trainer is no slow rollout.

The step clock is the test's (``aprof._core.steps.now_ns`` replaced by a counter the step
bodies advance), so which step is slow is decided by the test, not by the machine's load; the
rollout measure is checked on its own against the real clock, by order only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given

import aprof
from aprof._config import SlowTriggerConfig
from aprof._core import steps as steps_module
from aprof._core.admission import Admission
from aprof._core.triggers import SlowTrigger
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]
MS = 1_000_000


class Clock:
    """The steps' clock, in ns, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000 * MS

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += int(ms * MS)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(steps_module, "now_ns", fake)
    return fake


def _config(make_config: MakeConfig, **triggers: Any) -> aprof.ProfilerConfig:
    return make_config(
        global_profiler={"steps": [], "wait_for_stops": True},
        rollout={"start": "on_step", "forward_steps": None},
        triggers=triggers,
    )


async def _run(prof: aprof.Profiler, clock: Clock, durations: dict[int, float], n: int) -> None:
    for step in range(1, n + 1):
        async with prof.step(step):
            clock.advance(durations.get(step, 10.0))


def _captured(prof: aprof.Profiler) -> list[tuple[int, str]]:
    return [(w.step, w.requested_by) for w in prof.manifest.windows]


async def test_a_slow_step_captures_the_next_one_after_the_baseline_and_not_in_cooldown(
    make_config: MakeConfig, clock: Clock
) -> None:
    trigger = {"baseline_steps": 5, "factor": 2.0, "cooldown_steps": 3, "capture": 1}
    async with aprof.Profiler(_config(make_config, slow_step=trigger)) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        # Step 3: slow, but the baseline is not full. Step 8: slow (50 > 2 x 10): fires, step 9
        # is captured. Step 10: slow, in the cooldown (until step 8 + 1 + 1 + 3 = 13). Step 14:
        # slow again, after it: fires.
        await _run(prof, clock, {3: 50, 8: 50, 10: 50, 14: 50}, 16)
        status = prof._control.status()
    assert _captured(prof) == [(9, "slow_step"), (15, "slow_step")]
    [trigger_status] = status.triggers
    assert trigger_status.fired == 2 and trigger_status.median_s == pytest.approx(0.010)
    notes = [n.text for n in prof.manifest.notes if n.step in (8, 14)]
    assert len(notes) == 2 and "step 8 took 0.05 s, above 2 x the median 0.01 s" in notes[0]


async def test_confirm_needs_slow_steps_in_a_row(make_config: MakeConfig, clock: Clock) -> None:
    trigger = {"baseline_steps": 5, "confirm": 2, "capture": 2}
    async with aprof.Profiler(_config(make_config, slow_step=trigger)) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        # Step 6 is slow alone; steps 8 and 9 in a row (the baseline's median stays 10 ms).
        await _run(prof, clock, {6: 50, 8: 50, 9: 50}, 13)
    assert _captured(prof) == [(10, "slow_step"), (11, "slow_step")]


async def test_a_slow_trainer_fires_no_slow_rollout_and_a_slow_rollout_does(
    make_config: MakeConfig, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollout's seconds per step are the test's here (a stand-in for
    ``Admission.rollout_s``, whose measure is checked on its own below)."""
    rollout = {n: 0.010 for n in range(1, 20)} | {12: 0.100}
    current: list[int] = []

    def rollout_s(self: Admission) -> float | None:
        return rollout[current[-1]]

    monkeypatch.setattr(Admission, "rollout_s", rollout_s)
    trigger = {"baseline_steps": 5, "factor": 2.0}
    async with aprof.Profiler(_config(make_config, slow_rollout=trigger)) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in range(1, 15):
            current.append(n)
            async with prof.step(n):
                clock.advance(500 if n == 8 else 10)  # step 8: a slow trainer
    assert _captured(prof) == [(13, "slow_rollout")]


async def test_the_rollout_runs_from_the_first_request_in_to_the_last_one_out(
    make_config: MakeConfig,
) -> None:
    async with aprof.Profiler(_config(make_config)) as prof:
        admission = prof._admission
        async with prof.step(1):
            assert admission.rollout_s() is None
            before = time.monotonic_ns()
            async with prof.request(replica=0), prof.request(replica=1):
                pass
            after = time.monotonic_ns()
            gate = admission.gate
            assert before <= gate.first_ns <= gate.last_ns <= after
            assert admission.rollout_s() == (gate.last_ns - gate.first_ns) / 1e9
        async with prof.step(2):
            assert admission.rollout_s() is None  # a new step measures anew


# -- the trigger alone, against a plain model of its rule -------------------------------------


def _model(durations: list[tuple[float, bool]], cfg: SlowTriggerConfig) -> list[int]:
    """The steps (1-based) at which the rule fires, computed the slow, obvious way."""
    baseline: list[float] = []
    fired: list[int] = []
    streak, quiet_until = 0, 0
    for step, (seconds, profiled) in enumerate(durations, start=1):
        if profiled:
            continue
        full = len(baseline) >= cfg.baseline_steps
        if full and step >= quiet_until:
            median = statistics.median(baseline[-cfg.baseline_steps :])
            streak = streak + 1 if seconds > cfg.factor * median else 0
            if streak >= cfg.confirm:
                fired.append(step)
                streak = 0
                quiet_until = step + 1 + cfg.capture + cfg.cooldown_steps
        baseline.append(seconds)
    return fired


@given(
    durations=st.lists(
        st.tuples(st.sampled_from([1.0, 1.5, 2.0, 3.0, 10.0]), st.booleans()), max_size=80
    ),
    baseline_steps=st.integers(1, 6),
    confirm=st.integers(1, 3),
    cooldown=st.integers(0, 5),
    capture=st.integers(1, 3),
)
def test_the_trigger_follows_its_rule(
    durations: list[tuple[float, bool]],
    baseline_steps: int,
    confirm: int,
    cooldown: int,
    capture: int,
) -> None:
    cfg = SlowTriggerConfig(
        factor=2.0,
        baseline_steps=baseline_steps,
        confirm=confirm,
        cooldown_steps=cooldown,
        capture=capture,
    )
    trigger = SlowTrigger("slow_step", cfg)
    fired = [
        step
        for step, (seconds, profiled) in enumerate(durations, start=1)
        if trigger.observe(step, seconds, profiled=profiled) is not None
    ]
    assert fired == _model(durations, cfg)
    unprofiled = [s for s, p in durations if not p][-baseline_steps:]
    status = trigger.status()
    assert status.baseline == len(unprofiled)
    if len(unprofiled) == baseline_steps:
        assert status.median_s == statistics.median(unprofiled)
    else:
        assert status.median_s is None
