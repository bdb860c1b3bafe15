"""``aprof.verl.ProfiledTrainerMixin`` on verl 0.9.1's own ``RayPPOTrainer``: the hooks it
overrides are the ones ``fit()`` calls once per global step, with the same signatures."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

trainer_module = pytest.importorskip(
    "verl.trainer.ppo.ray_trainer", reason="nox -s verl installs verl 0.9.1"
)

import aprof  # noqa: E402
from aprof.testing import RecordingTarget, assert_windows  # noqa: E402

RayPPOTrainer = trainer_module.RayPPOTrainer
HOOKS = ("_start_profiling", "_stop_profiling")


def test_fit_calls_each_hook_once_per_step_of_its_loop() -> None:
    fit = ast.parse(textwrap.dedent(inspect.getsource(RayPPOTrainer.fit)))
    (steps,) = [
        n for n in ast.walk(fit) if isinstance(n, ast.For) and "batch_dict" in ast.unparse(n.target)
    ]
    called = [
        n.func.attr
        for n in ast.walk(steps)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in HOOKS
    ]
    assert called == list(HOOKS)  # in this order, once each, in every global step


def test_the_mixin_keeps_verls_hook_signatures() -> None:
    for hook in HOOKS:
        assert inspect.signature(getattr(aprof.verl.ProfiledTrainerMixin, hook), eval_str=True) == (
            inspect.signature(getattr(RayPPOTrainer, hook))
        )


class Trainer(aprof.verl.ProfiledTrainerMixin, RayPPOTrainer):  # type: ignore[misc]
    pass


def test_verls_own_hooks_run_and_aprof_steps_follow_global_steps(tmp_path: Path) -> None:
    trainer = object.__new__(Trainer)  # fit()'s other needs (GPUs, data) are not here
    cfg = {
        "global_profiler": {"steps": [2], "save_path": str(tmp_path)},
        "roles": {"actor": {"enable": True}},
    }
    seen = []
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(RecordingTarget("actor", kind="role"))
        trainer.aprof_profiler = prof
        for step in (1, 2, 3):
            trainer.global_steps = step
            trainer._start_profiling(False)  # verl's: returns at once, nothing to profile
            seen.append(prof.current_step)
            trainer._stop_profiling(False, run_command=False)
    assert seen == [1, 2, 3]
    assert_windows(prof.manifest, [{"step": 2, "target": "actor", "state": "done"}])


def test_the_stage_methods_keep_verls_signatures() -> None:
    from aprof.verl._trainer import TRAINER_STAGES

    for method in TRAINER_STAGES:
        ours = inspect.signature(getattr(aprof.verl.ProfiledTrainerMixin, method))
        verls = inspect.signature(getattr(RayPPOTrainer, method))
        assert list(ours.parameters) == list(verls.parameters), method


def test_fit_logs_what_update_actor_returns_in_its_metrics() -> None:
    fit = textwrap.dedent(inspect.getsource(RayPPOTrainer.fit))
    tree = ast.parse(fit)
    lines = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.Expr)]
    assert "actor_output = self._update_actor(batch)" in lines
    assert "actor_output_metrics = reduce_metrics(actor_output.meta_info['metrics'])" in lines
    assert "metrics.update(actor_output_metrics)" in lines
    assert "logger.log(data=metrics, step=self.global_steps)" in lines


class _Updated(RayPPOTrainer):  # type: ignore[misc]
    """verl's trainer whose worker groups are not here: ``_update_actor`` answers as the
    actor's worker group does, a ``DataProto`` with the update's metrics."""

    def _update_actor(self, batch: object) -> object:
        from verl import DataProto

        return DataProto(meta_info={"metrics": {"actor/pg_loss": [0.25, 0.75]}})


class _Measured(aprof.verl.ProfiledTrainerMixin, _Updated):  # type: ignore[misc]
    pass


def test_the_last_steps_figures_reach_verls_reduced_metrics(tmp_path: Path) -> None:
    from verl.utils.metric import reduce_metrics

    trainer = object.__new__(_Measured)
    cfg = {"global_profiler": {"steps": [], "save_path": str(tmp_path)}}
    reduced = []
    with aprof.BlockingProfiler(cfg) as prof:
        trainer.aprof_profiler = prof
        for step in (1, 2):
            trainer.global_steps = step
            trainer._start_profiling(False)
            output = trainer._update_actor(None)
            trainer._stop_profiling(False, run_command=False)
            reduced.append(reduce_metrics(output.meta_info["metrics"]))
            prof.flush()  # the step's timeline write (verl's steps take far longer than it)
    assert set(reduced[0]) == {"actor/pg_loss"}
    assert reduced[1]["aprof/step"] == 1
    assert reduced[1]["aprof/train_s"] > 0  # update_actor, a stage on the driver's timeline
    assert reduced[1]["actor/pg_loss"] == 0.5
