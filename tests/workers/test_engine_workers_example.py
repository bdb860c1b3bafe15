"""The engine-workers example as a real 2-process gloo job: torch traces for rank 0 only."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "engine_workers.py"
STAGES = {"actor": ["compute_log_prob", "update_actor"], "ref": ["compute_ref_log_prob"]}


@pytest.fixture(scope="module", params=["e2e", "discrete"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    mode: str = request.param
    out = tmp_path_factory.mktemp(mode)
    command = [sys.executable, str(EXAMPLE), "--out", str(out), "--steps", "1,2"]
    command += ["--num-steps", "3", "--world-size", "2", "--ranks", "0", "--mode", mode]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return mode, out, done.stdout


def user_ranges(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    assert trace["distributedInfo"]["rank"] == 0
    return [
        e["name"]
        for e in trace["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("ph") == "X"
    ]


def test_traces_for_selected_steps_and_rank_only(run: Any) -> None:
    mode, out, stdout = run
    traces = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.pt.trace.json.gz"))
    if mode == "e2e":
        expected = [
            f"step_{n}/{role}/rank_0/{role}-step{n}-rank0" for n in (1, 2) for role in STAGES
        ]
    else:
        expected = [
            f"step_{n}/{role}/rank_0/{stage}-step{n}-rank0"
            for n in (1, 2)
            for role, stages in STAGES.items()
            for stage in stages
        ]
    assert traces == sorted(f"{stem}.pt.trace.json.gz" for stem in expected)
    assert not list(out.rglob("rank_1"))
    assert not (out / "step_3").exists()
    assert f"traces in {out}" in stdout


def test_traces_hold_the_stage_ranges(run: Any) -> None:
    mode, out, _ = run
    for role, stages in STAGES.items():
        for n in (1, 2):
            folder = out / f"step_{n}" / role / "rank_0"
            if mode == "e2e":
                (trace,) = folder.glob("*.pt.trace.json.gz")
                names = user_ranges(trace)
                assert [s for s in names if s in stages] == stages
            else:
                for stage in stages:
                    assert stage in user_ranges(folder / f"{stage}-step{n}-rank0.pt.trace.json.gz")


def test_captures_json_lists_every_capture(run: Any) -> None:
    mode, out, _ = run
    listed: list[dict[str, Any]] = []
    for report in out.rglob("captures.json"):
        records = json.loads(report.read_text())
        for record in records:
            assert report.parent == out / f"step_{record['step']}" / record["role"] / "rank_0"
            assert record["state"] == "done" and record["error"] is None
            (file,) = record["files"]
            assert (out / file["path"]).stat().st_size == file["bytes"] > 0
        listed += records
    per_step = sum(len(stages) for stages in STAGES.values()) if mode == "discrete" else 2
    assert len(listed) == 2 * per_step
    assert {r["stage"] for r in listed} == (
        {None} if mode == "e2e" else {s for stages in STAGES.values() for s in stages}
    )
