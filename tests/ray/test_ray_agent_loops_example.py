"""examples/ray_agent_loops.py: agent loops in Ray actors, gated and counted by the driver."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import aprof

pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")
pytest.importorskip("torch")  # the reference servers run a torch model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_agent_loops.py"
WORKERS = [f"agent_loop_worker_{k}" for k in range(2)]


def test_every_actors_requests_count_in_one_window_per_replica(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--workers", "2"]
    command += ["--loops", "8", "--num-steps", "2", "--steps", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]

    manifest = aprof.load_manifest(tmp_path)
    listed = {entry.process: entry for entry in manifest.timeline}
    sent: Counter[tuple[int, int]] = Counter()
    counted: Counter[int] = Counter()
    for name in WORKERS:
        entry = listed[name]
        assert entry.path == f"timeline/{name}.trace.json.gz"
        assert entry.host is not None
        with gzip.open(tmp_path / entry.path, "rt") as f:
            trace = json.load(f)
        assert trace["aprof"]["process"] == name
        assert set(trace["aprof"]["clock"]) == {"wall_ns", "monotonic_ns"}
        requests = [
            e["args"] for e in trace["traceEvents"] if e.get("cat") == "request" and e["ph"] == "b"
        ]
        sent.update((args["step"], args["replica"]) for args in requests)
        # A window counts the requests that came while it started or captured; each server
        # ends its capture after 8 forward steps, and the requests after that go uncaptured.
        counted.update(
            args["replica"]
            for args in requests
            if args["step"] == 1 and (args["captured"] or args["gated"])
        )
        assert all(args["captured"] for args in requests if args["gated"])
        assert not any(args["captured"] or args["gated"] for args in requests if args["step"] == 2)

    states = [(w.step, w.target, w.state) for w in manifest.windows]
    assert states == [(1, "replica_0", "done"), (1, "replica_1", "done")]
    for window in manifest.windows:
        replica = int(window.target.removeprefix("replica_"))
        # The actors' counts, summed by the driver, match the requests on their timelines.
        assert window.requests.admitted == counted[replica] > 0
        assert window.stop_reason == "auto_stop"
        assert 1 <= window.requests.gated <= window.requests.admitted  # the one that opened it
    assert sent[2, 0] + sent[2, 1] > 0  # step 2 ran, not profiled
    assert not [note.text for note in manifest.notes]

    assert "admitted/gated" in done.stdout
    assert any(line.split()[:3] == ["1", "replica_0", "done"] for line in done.stdout.splitlines())
    for name in WORKERS:
        assert f"timeline: {tmp_path / 'timeline' / name}.trace.json.gz ({name} on" in done.stdout
