"""A worker rank's stages on its own timeline, in every step: listed in the manifest by the
driver and counted as training time by the report, profiled step or not."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import aprof
from aprof._report import accounting

MakeConfig = Callable[..., aprof.ProfilerConfig]
STEPS = (1, 2, 3)
US_S = 1e-5
"""How close a phase must be to the spans it is made of: each edge is rounded to a µs."""


def _work() -> int:
    """Something for a stage to take time over (the report needs no particular length)."""
    return sum(i * i for i in range(20_000))


def _stage_spans(root: Path, process: str) -> list[dict[str, Any]]:
    """The process's stage spans, in order, each with its ``dur`` (µs) from its end event."""
    spans: list[dict[str, Any]] = []
    for path in sorted((root / "timeline").glob(f"{process}*.trace.json.gz")):
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        ends = {e["id2"]["local"]: e["ts"] for e in events if e["ph"] == "e"}
        spans += [
            {**e, "dur": ends[e["id2"]["local"]] - e["ts"]}
            for e in events
            if e["ph"] == "b" and e["args"].get("aprof") == "stage"
        ]
    return spans


@pytest.mark.parametrize("told_steps", [True, False], ids=["told-steps", "windows-only"])
async def test_a_ranks_stages_are_training_time_in_every_step(
    make_config: MakeConfig, told_steps: bool
) -> None:
    """``told_steps``: the rank runs ``begin_step``/``end_step`` every step; else it hears of
    steps only from the driver's windows (as verl's workers do), and the report places its
    stages by their time."""
    pytest.importorskip("torch")  # the profiled step's capture is a real torch capture
    cfg = make_config(global_profiler={"steps": [2]}, roles={"actor": {"ranks": [0]}})
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    group = aprof.WorkerGroup("actor", [aprof.LocalWorker(wp)], cfg)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(group)
        for n in STEPS:
            async with prof.step(n):
                if told_steps:
                    wp.begin_step(n)
                with wp.stage("update_actor"):
                    _work()
                async with wp.stage("compute_log_prob"):
                    _work()
                if told_steps:
                    wp.end_step()

    root = Path(prof.save_path)
    process = f"actor-rank0-{os.getpid()}"
    listed = [f for f in aprof.load_manifest(root).timeline if f.process == process]
    assert listed and all(f.events > 0 for f in listed)
    spans = _stage_spans(root, process)
    assert [s["name"] for s in spans] == ["update_actor", "compute_log_prob"] * len(STEPS)
    assert {(s["args"]["role"], s["args"]["rank"]) for s in spans} == {("actor", 0)}
    # Told only its windows, a rank knows the profiled step alone.
    told = STEPS if told_steps else (None, 2, None)
    expected_steps = [n for n in told for _ in range(2)]
    assert [s["args"].get("step") for s in spans] == expected_steps

    found = accounting(root)
    by_step = {a.step: a for a in found.accounts}
    assert sorted(by_step) == list(STEPS)
    for i, n in enumerate(STEPS):
        mine = spans[2 * i : 2 * i + 2]
        assert by_step[n].train_s == pytest.approx(sum(s["dur"] for s in mine) / 1e6, abs=2 * US_S)
        assert by_step[n].profiled == (n == 2)
    assert not [p for p in found.problems if process in p]


async def test_a_rank_not_selected_records_no_timeline(make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {"ranks": [0]}})
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=1, world_size=2)
    with wp.stage("update_actor"):
        _work()
    assert wp.hand_over_timeline() is None
    assert not (Path(cfg.global_profiler.save_path) / "timeline").exists()


async def test_timeline_off_records_no_worker_stage(make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {"ranks": [0]}}, timeline={"enable": False})
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    wp.begin_step(5)  # not selected: no capture either, so the stage is a flag check
    with wp.stage("update_actor"):
        _work()
    wp.end_step()
    assert wp.hand_over_timeline() is None


async def test_a_malformed_hand_over_costs_its_own_listing_only(make_config: MakeConfig) -> None:
    """A rank's hand-over crosses a process boundary: one the driver cannot read is logged
    and the run goes on, its manifest valid."""

    class BadRank:
        rank = 0

        async def begin(self, step: int) -> None:
            return None

        async def end(self) -> list[aprof.WorkerCapture]:
            return []

        async def timeline(self) -> aprof.WorkerTimeline | None:
            return aprof.WorkerTimeline("actor-rank0", ({"path": 3},), ledger="not a ledger")

    cfg = make_config(roles={"actor": {"ranks": [0]}})
    with capture_logs() as logs:
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(aprof.WorkerGroup("actor", [BadRank()], cfg))
            async with prof.step(1):
                pass
    # Once after the window, once as the profiler closed.
    taken = [e for e in logs if e["event"] == "worker timeline not taken"]
    assert [e["process"] for e in taken] == ["actor-rank0", "actor-rank0"]
    manifest = aprof.load_manifest(prof.save_path)
    assert [w.state for w in manifest.windows] == ["done"]
    assert {f.process for f in manifest.timeline} == {f"driver-{os.getpid()}"}
