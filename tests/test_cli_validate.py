"""`aprof validate` in a real subprocess: resolved YAML on success, one error line otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aprof._config import load_config

REPO = Path(__file__).resolve().parent.parent


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "aprof.cli", "validate", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("aprof validate: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_valid_config_prints_resolved_yaml(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("global_profiler: {steps: '1-2,5'}\nrollout: {replicas: all}\n")
    proc = validate(str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    data = yaml.safe_load(proc.stdout)
    assert data["global_profiler"]["steps"] == [1, 2, 5]
    assert data["rollout"]["replicas"] == "all"
    assert data["timeouts"]["stop_s"] == 600  # defaults are printed too
    assert load_config(proc.stdout) == load_config(path)


def test_verl_config(tmp_path: Path) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(
        "global_profiler: {tool: torch, steps: [2], save_path: ./profile}\n"
        "actor_rollout_ref:\n"
        "  actor: {profiler: {enable: true, ranks: [0]}}\n"
        "  rollout:\n"
        "    tensor_model_parallel_size: 2\n"
        "    profiler: {enable: '${oc.select:actor_rollout_ref.actor.profiler.enable,false}',"
        " ranks: [2]}\n"
    )
    proc = validate("--verl", str(path))
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert data["global_profiler"]["steps"] == [2]
    assert data["roles"]["actor"]["enable"] is True
    assert data["rollout"]["replicas"] == [1]
    assert data["rollout"]["enable"] is True


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_one_error_line(validate(str(missing)), str(missing), "No such file")


def test_directory(tmp_path: Path) -> None:
    assert_one_error_line(validate(str(tmp_path)), str(tmp_path))


def test_broken_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("rollout:\n  delay: [1, 2\n")
    assert_one_error_line(validate(str(path)), "invalid YAML at line")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("rollout: {forward_steps: -1}\n", ("rollout.forward_steps", "must be > 0, got -1")),
        ("rollout: {forwrd_steps: 1}\n", ("did you mean 'forward_steps'?",)),
        ("global_profiler: {steps: '3-1'}\n", ("global_profiler.steps", "reversed range")),
        ('roles: {"a\\nb": {}}\n', ("roles", "role names")),  # a newline in a key
        ('"x\\ny": 1\n', ("unknown key",)),
        ("[1, 2]\n", ("mapping",)),
    ],
)
def test_invalid_value(tmp_path: Path, text: str, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert_one_error_line(validate(str(path)), *fragments)


def test_verl_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "verl.yaml"
    path.write_text("actor_rollout_ref: {actor: {profiler: {ranks: '0'}}}\n")
    assert_one_error_line(
        validate("--verl", str(path)), "actor_rollout_ref.actor.profiler.ranks", "expected a list"
    )


def test_help() -> None:
    proc = validate("--help")
    assert proc.returncode == 0
    assert "--verl" in proc.stdout and "CONFIG" in proc.stdout
