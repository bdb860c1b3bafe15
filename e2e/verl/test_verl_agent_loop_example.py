"""examples/verl_agent_loop.py: verl 0.9.1's ``SingleTurnAgentLoop`` in Ray workers, with verl's
manager, balancer and client, profiled by aprof from a synchronous trainer loop."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("verl.experimental.agent_loop", reason="nox -s verl installs verl 0.9.1")
pytest.importorskip("ray")

import aprof

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_agent_loop.py"
WORKERS, SAMPLES = 2, 8


def test_steps_1_and_3_of_4_count_every_agent_loop_in_one_window_per_replica(
    tmp_path: Path,
) -> None:
    command = [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--steps", "1,3"]
    command += ["--num-steps", "4", "--workers", str(WORKERS), "--samples", str(SAMPLES)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "verl overrides: global_profiler.steps=null" in done.stderr

    manifest = aprof.load_manifest(tmp_path)
    sent: Counter[tuple[int, int]] = Counter()
    workers = [t for t in manifest.timeline if t.process.startswith("agent_loop_worker_")]
    assert sorted(t.process for t in workers) == [f"agent_loop_worker_{k}" for k in range(WORKERS)]
    for entry in workers:
        with gzip.open(tmp_path / entry.path, "rt") as f:
            events = json.load(f)["traceEvents"]
        begun = [e["args"] for e in events if e.get("cat") == "request" and e["ph"] == "b"]
        sent.update((args["step"], args["replica"]) for args in begun)
        assert all(args["captured"] for args in begun if args["step"] in (1, 3))
        assert not any(args["captured"] for args in begun if args["step"] in (2, 4))
    for step in (1, 2, 3, 4):  # every agent loop made one request, in the step it ran in
        assert sent[step, 0] + sent[step, 1] == WORKERS * SAMPLES

    windows = [(w.step, w.target, w.state) for w in manifest.windows]
    assert windows == [(s, f"replica_{r}", "done") for s in (1, 3) for r in (0, 1)]
    for window in manifest.windows:
        replica = int(window.target.removeprefix("replica_"))
        assert window.requests.admitted == sent[window.step, replica]
        assert window.files  # the reference servers' traces of the window
    assert not [note.text for note in manifest.notes]
    assert any(line.split()[:3] == ["3", "replica_1", "done"] for line in done.stdout.splitlines())
