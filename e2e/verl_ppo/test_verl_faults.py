"""aprof failing inside verl's real training loop never fails the training: an unwritable
``save_path``, a replica that never answers its profiling route. A config aprof cannot run is
refused at launch, with one line naming the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from verl_runs import run_example, windows

HERE = Path(__file__).resolve().parent


def test_an_unwritable_save_path_leaves_training_whole(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("save_path cannot be a folder below a file\n")
    save_path = blocked / "profile"
    done = run_example(
        tmp_path / "run", "sync", "--num-steps", "2",
        f"++aprof.global_profiler.save_path={save_path}",
    )  # fmt: skip
    assert done.code == 0, done.log[-4000:]
    assert [step for step, _ in done.logged()] == [1, 2]  # verl trained and logged both
    assert not save_path.exists()
    assert "aprof profiler did not open" in done.log


def test_a_replica_that_never_answers_its_profiling_route_leaves_training_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "hang_start_profile")
    done = run_example(
        tmp_path, "sync", "--steps", "1", "--num-steps", "2", "++aprof.timeouts.start_s=5"
    )
    assert done.code == 0, done.log[-4000:]
    assert [step for step, _ in done.logged()][:2] == [1, 2]
    (replica,) = [w for w in windows(done.save_path, 1) if w.kind == "rollout"]
    assert replica.state in ("failed", "timeout"), replica
    assert replica.error, replica
    (actor,) = [w for w in windows(done.save_path, 1) if w.target == "actor"]
    assert actor.state == "done"  # the other captures of the step went on


def test_a_config_aprof_cannot_run_is_refused_at_launch(tmp_path: Path) -> None:
    done = run_example(tmp_path, "sync", "--num-steps", "1", "++aprof.rollout.replicas=[-1]")
    assert done.code != 0
    refusals = [line for line in done.log.splitlines() if "aprof.rollout.replicas" in line]
    assert refusals, done.log[-4000:]
