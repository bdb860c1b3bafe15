"""`aprof validate` in a real subprocess: resolved YAML on success, one error line otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from aprof._config import load_config
from aprof._config.reading import MAX_CONFIG_BYTES

REPO = Path(__file__).resolve().parents[2]


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "aprof", "validate", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO must not hang the test (it did, before the file checks)
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
        "  actor: {profiler: {enable: true, ranks: [0], tool_config: {torch: {discrete: true}}}}\n"
        "  rollout:\n"
        "    tensor_model_parallel_size: 2\n"
        "    profiler: {enable: '${oc.select:actor_rollout_ref.actor.profiler.enable,false}',"
        " ranks: [2]}\n"
    )
    proc = validate("--verl", str(path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # nothing to warn about
    data = yaml.safe_load(proc.stdout)
    assert data["global_profiler"]["steps"] == [2]
    assert data["roles"]["actor"]["enable"] is True
    assert data["rollout"]["replicas"] == [1]
    assert data["rollout"]["enable"] is True
    assert "#   global_profiler.steps=null\n" in proc.stdout  # the overrides, as comments
    assert load_config(proc.stdout) == load_config(data)


def test_verl_warnings_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(
        "global_profiler: {tool: torch, step: [1, 2, 5], relocate_results: true}\n"
        "actor_rollout_ref:\n"
        "  actor: {profiler: {enable: true, rank: [1]}}\n"
    )
    proc = validate("--verl", str(path))
    assert proc.returncode == 0, proc.stderr
    warnings = proc.stderr.splitlines()
    assert all(line.startswith("warning: ") for line in warnings)
    assert "warning: global_profiler.step: unknown key (did you mean 'steps'?)" in warnings
    assert (
        "warning: actor_rollout_ref.actor.profiler.rank: unknown key (did you mean 'ranks'?)"
        in warnings
    )
    assert any("relocate_results is verl's own and not used by aprof" in w for w in warnings)
    assert any("discrete mode" in w for w in warnings)  # the rollout is not profiled
    assert yaml.safe_load(proc.stdout)["rollout"]["enable"] is False


def test_plain_validate_of_a_verl_config_points_to_verl(tmp_path: Path) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text("global_profiler: {_target_: verl.utils.profiler.ProfilerConfig}\n")
    assert_one_error_line(validate(str(path)), "global_profiler._target_", "aprof.verl.load")


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


def alias_bomb() -> str:
    """A few hundred bytes of YAML: 9 levels, each listing the one above 9 times (9**9 strings)."""
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for name, above in zip("bcdefghi", "abcdefgh", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{above}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def in_file(name: str, text: str) -> Callable[[Path], str]:
    def make(tmp_path: Path) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return make


def fifo(tmp_path: Path) -> str:
    path = tmp_path / "fifo.yaml"
    os.mkfifo(path)  # nothing ever writes to it
    return str(path)


DIGITS = "9" * 5000
TOO_DEEP = "nested more than 100 levels deep (the limit of a config)"


@pytest.mark.parametrize(
    ("make", "line"),
    [
        pytest.param(
            in_file("bomb.yaml", alias_bomb()),
            "bomb.yaml: more than 1000000 values with aliases expanded (the limit of a config)",
            id="alias-bomb",
        ),
        pytest.param(
            in_file("big.yaml", "#" * (MAX_CONFIG_BYTES + 1)),
            "big.yaml: larger than 1048576 bytes (the limit of a config file)",
            id="huge-file",
        ),
        pytest.param(
            lambda _: "/dev/zero",
            "/dev/zero: not a regular file: a character device",
            id="dev-zero",
        ),
        pytest.param(fifo, "fifo.yaml: not a regular file: a FIFO", id="fifo"),
        pytest.param(
            in_file("nul.yaml", 'global_profiler: {save_path: "out/a\\0b"}\n'),
            "global_profiler.save_path: must not hold a NUL character, got 'out/a\\x00b'",
            id="nul-in-save-path",
        ),
        pytest.param(
            in_file("long.yaml", f"rollout: {{delay: {DIGITS}}}\n"),
            "long.yaml: invalid YAML at line 1, column 18: an integer of 5000 digits",
            id="long-int-yaml",
        ),
        pytest.param(
            in_file("long.json", f'{{"rollout": {{"delay": {DIGITS}}}}}'),
            "long.json: invalid JSON: an integer of 5000 digits",
            id="long-int-json",
        ),
        pytest.param(
            in_file("deep.yaml", "a: " + "[" * 100_000 + "]" * 100_000),
            f"deep.yaml: invalid YAML at line 1, column 103: {TOO_DEEP}",
            id="deep-yaml",
        ),
        pytest.param(
            in_file("deep.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
            f"deep.json: {TOO_DEEP}",
            id="deep-json",
        ),
        pytest.param(
            in_file("dup.json", '{"rollout": {"delay": 1, "delay": 2}}'),
            "dup.json: invalid JSON: key 'delay' given twice in one object",
            id="duplicate-json-key",
        ),
        pytest.param(
            in_file("aliases.yaml", "a: &x 1\nb: [" + ", ".join(["*x"] * 101) + "]\n"),
            "aliases.yaml: invalid YAML at line 2, column 405: more than 100 aliases",
            id="too-many-aliases",
        ),
        pytest.param(
            in_file("stop.yaml", "timeouts: {stop_s: 1.0e+300}\n"),
            "aprof validate: timeouts.stop_s: must be <= 86400, got 1e+300",
            id="stop-s-too-long",
        ),
        pytest.param(
            in_file("poll.json", '{"timeouts": {"poll_s": 1e-300}}'),
            "aprof validate: timeouts.poll_s: must be >= 0.005, got 1e-300",
            id="poll-s-too-short",
        ),
    ],
)
def test_hostile_input_gives_one_line(
    tmp_path: Path, make: Callable[[Path], str], line: str
) -> None:
    assert_one_error_line(validate(make(tmp_path)), line)


def test_verl_file_is_bounded_too(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert_one_error_line(
        validate("--verl", str(path)), f"{path}: more than 1000000 values with aliases expanded"
    )
