"""structlog output: JSON lines on request, each window transition logged exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    import aprof
    from aprof.testing import RecordingTarget

    async def main():
        config = {
            "global_profiler": {
                "steps": [1, 2], "save_path": sys.argv[1], "wait_for_stops": True
            },
            "rollout": {"replicas": "all"},
            "log": {"format": sys.argv[2]},
        }
        async with aprof.Profiler(config) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))
            prof.add_target(RecordingTarget("replica_1", replica=1, fail_start=True))
            for step in (1, 2, 3):
                async with prof.step(step):
                    for replica in (0, 1):
                        async with prof.request(replica=replica):
                            pass

    asyncio.run(main())
    """
)


def run_driver(tmp_path: Path, fmt: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path / "out"), fmt],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_json_logs_each_window_transition_once(tmp_path: Path) -> None:
    """Every line is JSON; each (step, target, transition) appears exactly once."""
    events = [json.loads(line) for line in run_driver(tmp_path, "json").splitlines()]
    transitions = Counter(
        (e["step"], e["target"], e["event"]) for e in events if e["event"].startswith("window ")
    )
    expected = {
        (step, "replica_0", f"window {t}")
        for step in (1, 2)
        for t in ("starting", "active", "stopping", "done")
    } | {(step, "replica_1", f"window {t}") for step in (1, 2) for t in ("starting", "failed")}
    assert set(transitions) == expected
    assert set(transitions.values()) == {1}
    failed = next(e for e in events if e["event"] == "window failed")
    assert failed["level"] == "warning" and "start refused" in failed["detail"]
    assert all(e["run_id"] == events[0]["run_id"] for e in events)


def test_console_logs_are_readable_lines(tmp_path: Path) -> None:
    """The default console format names the event, step and target on one line."""
    lines = run_driver(tmp_path, "console").splitlines()
    active = [line for line in lines if "window active" in line]
    assert len(active) == 2 and all("target=replica_0" in line for line in active)
