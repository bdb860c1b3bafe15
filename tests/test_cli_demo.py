"""``aprof demo`` and the examples, run as real subprocesses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aprof
from aprof.testing import assert_windows

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_demo_profiles_the_selected_steps(tmp_path: Path) -> None:
    """The demo runs end to end and leaves a manifest with one window per (step, replica)."""
    out = tmp_path / "demo"
    done = run(
        "-m", "aprof", "demo", "--num-steps", "3", "--steps", "1,3", "--replicas", "2",
        "--concurrency", "4", "--forward-steps", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "replica_1" in done.stdout and "manifest:" in done.stdout
    assert_windows(
        out,
        [
            {"step": s, "target": f"replica_{r}", "state": "done", "stop_reason": "auto_stop"}
            for s in (1, 3)
            for r in (0, 1)
        ],
    )
    manifest = aprof.load_manifest(out)
    assert all((w.forward_steps.observed or 0) >= 2 for w in manifest.windows)


def test_demo_bad_input_is_one_line(tmp_path: Path) -> None:
    """A bad option value exits 1 with one line and no traceback."""
    done = run("-m", "aprof", "demo", "--steps", "0,1", "--out", str(tmp_path / "x"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("aprof demo: global_profiler.steps")


def test_custom_target_example(tmp_path: Path) -> None:
    """The custom-target example writes one heap report per profiled step."""
    done = run(str(ROOT / "examples" / "custom_target.py"), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    manifest = aprof.load_manifest(tmp_path / "out")
    assert [(w.step, w.state) for w in manifest.windows] == [(2, "done"), (3, "done")]
    report = tmp_path / "out" / manifest.windows[0].files[0].path
    assert "size=" in report.read_text()


def test_example_config_validates() -> None:
    """The example config of the README loads."""
    config = aprof.load_config(ROOT / "examples" / "profile.yaml")
    assert 5 in config.global_profiler.steps and config.rollout.forward_steps == 8
