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


def test_fit_logs_each_step_with_the_tracking_logger_it_imports() -> None:
    from aprof.verl._trainer import TRACKING

    fit = textwrap.dedent(inspect.getsource(RayPPOTrainer.fit))
    tree = ast.parse(fit)
    lines = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.Expr)]
    imported = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert f"from {TRACKING} import Tracking" in imported  # read as fit() begins
    assert any(line.startswith("logger = Tracking(") for line in lines)
    assert "logger.log(data=metrics, step=self.global_steps)" in lines
