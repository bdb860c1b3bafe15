"""Shared fixtures: a profiler config in a temporary save_path, and one `aprof demo` run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., aprof.ProfilerConfig]:
    """Build a config whose save_path is the test's tmp_path; keyword sections override."""

    def build(**sections: Any) -> aprof.ProfilerConfig:
        data: dict[str, Any] = {
            "global_profiler": {"steps": [1], "save_path": str(tmp_path / "profile")},
            "timeouts": {"start_s": 2, "stop_s": 2, "poll_s": 0.005, "connect_s": 1},
        }
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return aprof.load_config(data)

    return build


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ``aprof demo`` run, steps 1 and 2 of 3 profiled (two replicas, a trainer), merged and
    reported as the demo does. Shared: read it, or copy it to damage it."""
    pytest.importorskip("torch")  # the demo's servers and trainer run torch
    out = tmp_path_factory.mktemp("demo")
    command = [sys.executable, "-m", "aprof", "demo", "--out", str(out)]
    command += ["--steps", "1,2", "--num-steps", "3"]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
