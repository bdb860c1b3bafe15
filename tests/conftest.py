"""Shared fixtures: a profiler config in a temporary save_path, and one `aprof demo` run; and
hypothesis' profiles.

Hypothesis profiles (per-test ``@settings`` still set what they name, ``max_examples`` say):

- ``deterministic``, loaded here, what a plain ``python -m pytest`` runs (the README's command,
  CI's ``.ci/run``): the same examples on every run and machine (``derandomize``), no example
  database, no deadline and no ``too_slow`` health check (a busy machine's timing is not a
  failure), and the blob that reproduces a failure printed. A property test that fails here
  fails every time, on every machine.
- ``explore`` (``--hypothesis-profile=explore``; ``nox -s tests`` and ``nox -s faults`` pass
  it): new random examples each run, failures kept in ``.hypothesis/`` and replayed first,
  hypothesis' own deadline and health checks. What it finds becomes an ``@example``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import aprof

_HYPOTHESIS = settings.get_profile("default")  # hypothesis' own, whatever CI variables say
settings.register_profile(
    "deterministic",
    parent=_HYPOTHESIS,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("explore", parent=_HYPOTHESIS, derandomize=False, print_blob=True)
# Before any test module is imported (their @settings inherit what is loaded then); the
# --hypothesis-profile option, read after this file, loads another.
settings.load_profile("deterministic")


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
    """An ``aprof demo`` run, steps 1 and 2 of 3 profiled (three replicas, the first two
    captured and the last not, a trainer), merged and reported as the demo does. Shared: read
    it, or copy it to damage it."""
    pytest.importorskip("torch")  # the demo's servers and trainer run torch
    out = tmp_path_factory.mktemp("demo")
    command = [sys.executable, "-m", "aprof", "demo", "--out", str(out)]
    command += ["--steps", "1,2", "--num-steps", "3", "--replicas", "3"]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
