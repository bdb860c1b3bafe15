"""``aprof.verl.ProfiledTrainerMixin``: every global step of verl's ``fit()`` an aprof step.

verl is not installed here: ``VerlTrainer`` stands in for verl 0.9.1's ``RayPPOTrainer`` with
its two per-step hooks, the worker-group calls the mixin runs as stages, their signatures, and
the order ``fit()`` calls them in, and the ``Tracking`` logger of its module that ``fit()``
logs each step's metrics with (the real class is checked against it in
``e2e/verl/test_verl_trainer.py``, and run whole in ``e2e/verl_ppo``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

import pytest

import aprof
from aprof._report import collect
from aprof.testing import RecordingTarget, assert_windows
from aprof.verl._trainer import TRACKING

MakeConfig = Callable[..., aprof.ProfilerConfig]


class Tracking:
    """verl's logger as ``fit()`` makes and calls it (``verl.utils.tracking.Tracking``)."""

    logged: ClassVar[list[dict[str, float]]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        self.logged.append({**data, "logged_step": step})


@pytest.fixture(autouse=True)
def verls_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``verl.utils.tracking`` as far as ``fit()`` imports it: its ``Tracking``."""
    module = ModuleType(TRACKING)
    module.Tracking = Tracking  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, TRACKING, module)


class VerlTrainer:
    """verl 0.9.1's ``RayPPOTrainer`` as far as the mixin meets it."""

    def __init__(self) -> None:
        self.global_steps = 0
        self.calls: list[tuple[str, int, bool]] = []
        self.seen: list[int | None] = []
        """aprof's current step while each step's body ran."""

    def _start_profiling(self, do_profile: bool) -> None:
        self.calls.append(("verl start", self.global_steps, do_profile))

    def _stop_profiling(self, do_profile: bool, run_command: bool = False) -> None:
        self.calls.append(("verl stop", self.global_steps, do_profile))

    def _compute_old_log_prob(self, batch: Any) -> Any:
        return batch

    def _update_actor(self, batch: Any) -> Any:
        return {"actor/loss": 1.0}

    def fit(
        self,
        steps: int,
        *,
        fail_at: int | None = None,
        after_step: Callable[[], None] = lambda: None,
    ) -> None:
        """As verl's: start hook, the step's work (old log-probs, the actor's update), stop
        hook, the step's metrics logged, then the next global step. ``after_step``: the
        test's, after each step."""
        logger = sys.modules[TRACKING].Tracking()  # verl's fit(): imports it, makes one
        self.global_steps = 1
        for _ in range(steps):
            self._start_profiling(False)  # verl's own profiler is off (plan.overrides)
            prof = getattr(self, "aprof_profiler", None)
            self.seen.append(None if prof is None else prof.current_step)
            if self.global_steps == fail_at:
                raise RuntimeError("a step failed")
            batch = self._compute_old_log_prob(object())
            metrics = self._update_actor(batch)
            self._stop_profiling(False, run_command=False)
            logger.log(data=metrics, step=self.global_steps)
            self.global_steps += 1
            after_step()


class Trainer(aprof.verl.ProfiledTrainerMixin, VerlTrainer):
    pass


def test_each_global_step_of_fit_is_an_aprof_step(make_config: MakeConfig) -> None:
    trainer = Trainer()
    with aprof.BlockingProfiler(
        make_config(global_profiler={"steps": [1, 3]}, roles={"actor": {"enable": True}})
    ) as prof:
        prof.add_target(RecordingTarget("actor", kind="role"))
        trainer.aprof_profiler = prof
        trainer.fit(4)
    assert trainer.seen == [1, 2, 3, 4]
    assert_windows(
        prof.manifest,
        [{"step": n, "target": "actor", "state": "done", "stop_reason": "step_end"}
         for n in (1, 3)],
    )  # fmt: skip
    # verl's own hooks still run, each once per step.
    assert trainer.calls == [
        (hook, n, False) for n in range(1, 5) for hook in ("verl start", "verl stop")
    ]


def test_the_first_stage_after_generation_ends_the_rollout_for_colocated_roles(
    make_config: MakeConfig,
) -> None:
    """verl's hybrid engine: the actor shares the rollout's GPUs (npu: exclusive). The step's
    first trainer stage follows its generation: the mixin says the rollout is over there, so
    the held actor capture starts, after the rollout capture has stopped, and before that
    first stage runs (the rollout's stop takes a while: the stage is not let through early)."""
    capturing: list[bool] = []

    class Watched(VerlTrainer):
        def _compute_old_log_prob(self, batch: Any) -> Any:
            capturing.append(actor.active is not None)
            return super()._compute_old_log_prob(batch)

    class WatchedTrainer(aprof.verl.ProfiledTrainerMixin, Watched):
        pass

    trainer = WatchedTrainer()
    cfg = make_config(
        global_profiler={"steps": [1], "tool": "npu"},
        roles={"actor": {"enable": True}},
        rollout={"forward_steps": None, "start": "on_step"},
        colocated=[{"role": "actor"}],
    )
    actor = RecordingTarget("actor", kind="role")
    replica = RecordingTarget("replica_0", replica=0, stop_latency=0.05)
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(actor)
        prof.add_target(replica)
        trainer.aprof_profiler = prof
        trainer.fit(1)
    assert capturing == [True]
    assert_windows(
        prof.manifest,
        [
            {"step": 1, "target": "replica_0", "state": "done", "stop_reason": "rollout_end"},
            {"step": 1, "target": "actor", "state": "done", "stop_reason": "step_end"},
        ],
    )
    (held,) = [w for w in prof.manifest.windows if w.target == "actor"]
    (served,) = [w for w in prof.manifest.windows if w.target == "replica_0"]
    assert held.waited_for is not None and held.waited_for.targets == ["replica_0"]
    assert served.stopped_ns is not None and held.started_ns is not None
    assert served.stopped_ns <= held.started_ns


def test_a_step_that_raised_is_closed_when_the_next_begins(make_config: MakeConfig) -> None:
    trainer = Trainer()
    with aprof.BlockingProfiler(
        make_config(global_profiler={"steps": [1, 2]}, roles={"actor": {"enable": True}})
    ) as prof:
        prof.add_target(RecordingTarget("actor", kind="role"))
        trainer.aprof_profiler = prof
        with pytest.raises(RuntimeError, match="a step failed"):
            trainer.fit(3, fail_at=1)
        assert prof.current_step == 1  # fit() never reached its stop hook
        trainer.fit(2)  # verl's resumed run: step 1 again, then 2
        assert trainer.seen == [1, 1, 2]
    # Step 1's window closed as the resumed run began; a step profiled once is not again.
    assert [(w.step, w.state) for w in prof.manifest.windows] == [(1, "done"), (2, "done")]


def test_without_a_profiler_or_after_it_closed_the_trainer_runs_as_verls(
    make_config: MakeConfig,
) -> None:
    trainer = Trainer()
    trainer.fit(2)
    assert trainer.seen == [None, None]
    with aprof.BlockingProfiler(make_config()) as prof:
        trainer.aprof_profiler = prof
    trainer.fit(2)  # the profiler closed: a warning, never an error
    assert len(trainer.calls) == 8


def test_stages_are_timed_and_each_steps_figures_reach_the_next_steps_metrics(
    make_config: MakeConfig,
) -> None:
    trainer = Trainer()
    Tracking.logged = []
    with aprof.BlockingProfiler(make_config(global_profiler={"steps": []})) as prof:
        trainer.aprof_profiler = prof
        trainer.fit(3)
    assert [logged["logged_step"] for logged in Tracking.logged] == [1, 2, 3]
    first, *later = Tracking.logged
    assert first == {"actor/loss": 1.0, "logged_step": 1}  # no step had ended before it
    for n, logged in enumerate(later, start=1):
        assert logged["actor/loss"] == 1.0  # verl's own metrics, as they were
        assert logged["aprof/step"] == n  # the step before the one that logs them
        assert logged["aprof/train_s"] > 0 and logged["aprof/requests"] == 0
        total = (
            logged["aprof/rollout_s"]
            + logged["aprof/train_s"]
            - logged["aprof/overlap_s"]
            + logged["aprof/idle_s"]
        )
        assert abs(total - logged["aprof/wall_s"]) < 1e-6
        assert logged["aprof/trainer_idle_ratio"] == pytest.approx(
            1 - logged["aprof/train_s"] / logged["aprof/wall_s"]
        )
    assert trainer.aprof_tracking is not None  # for the last step's, once the profiler closed
    accounts = collect(prof.save_path).accounts
    assert [a.step for a in accounts] == [1, 2, 3]
    assert all(a.train_s > 0 for a in accounts)  # the stages, on the driver's timeline
    assert sys.modules[TRACKING].Tracking is Tracking  # verl's own again after fit()
