"""Mini-batch schedules with real torch.profiler traces: which mini-batches each file holds."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._workers import CAPTURES_FILE, WorkerProfiler

torch = pytest.importorskip("torch")

MakeConfig = Callable[..., aprof.ProfilerConfig]
MINI_BATCH = re.compile(r"mini_batch(\d+)")
PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)")


def scheduled(make_config: MakeConfig, schedule: dict[str, Any], **sections: Any) -> Any:
    return make_config(
        tool_config={"torch": {"contents": ["cpu"], "schedule": schedule}}, **sections
    )


def mini_batch(wp: WorkerProfiler, i: int, *, step: bool = True) -> None:
    """One update mini-batch, marked as ``mini_batch<i>`` in the trace, then ``wp.step()``."""
    with torch.profiler.record_function(f"mini_batch{i}"):
        torch.ones(8, 8) @ torch.ones(8, 8)
    if step:
        wp.step()


def numbers(trace: Path, pattern: re.Pattern[str]) -> list[int]:
    """The indices of the ranges named by ``pattern`` in a gzipped Chrome trace."""
    with gzip.open(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    found = {
        int(m[1])
        for e in events
        if e.get("ph") == "X" and (m := pattern.fullmatch(str(e.get("name", ""))))
    }
    return sorted(found)


def files_of(wp: WorkerProfiler, cfg: aprof.ProfilerConfig) -> dict[str, Path]:
    save_path = cfg.global_profiler.save_path
    return {Path(f.path).name: save_path / f.path for c in wp.captures for f in c.files}


def test_e2e_schedule_gives_one_trace_per_cycle_across_a_continuous_run(
    make_config: MakeConfig,
) -> None:
    """wait 1, warmup 1, active 2: mini-batches 2-3 and 6-7 of the run's 8 are recorded."""
    cfg = scheduled(
        make_config,
        {"wait": 1, "warmup": 1, "active": 2},
        global_profiler={"steps": [1, 2], "continuous": True},
        roles={"actor": {}},
    )
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    for step in (1, 2):
        with wp.global_step(step), wp.stage("update_actor"):
            for i in range(4):
                mini_batch(wp, (step - 1) * 4 + i)

    (capture,) = wp.captures
    assert (capture.step, capture.last_step, capture.state, capture.note) == (1, 2, "done", None)
    files = files_of(wp, cfg)
    assert list(files) == [
        "actor-step1-rank0-mb2-3.pt.trace.json.gz",
        "actor-step1-rank0-mb6-7.pt.trace.json.gz",
    ]
    first, second = files.values()
    assert numbers(first, MINI_BATCH) == [2, 3]  # warmup (1) and wait (0) are not in it
    assert numbers(first, PROFILER_STEP) == [2, 3]
    assert numbers(second, MINI_BATCH) == [6, 7]
    assert [f.bytes for f in capture.files] == [p.stat().st_size for p in files.values()]


def test_discrete_schedule_applies_to_its_stages_only(make_config: MakeConfig) -> None:
    cfg = scheduled(
        make_config,
        {"warmup": 1, "active": 2, "repeat": 1},
        roles={"actor": {"discrete": True}},
    )
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    with wp.global_step(1):
        with wp.stage("compute_log_prob"):
            for i in range(2):
                mini_batch(wp, i)  # not a scheduled stage: wp.step() does nothing
        with wp.stage("actor_update"):
            for i in range(5):
                mini_batch(wp, i)

    files = files_of(wp, cfg)
    assert list(files) == [
        "compute_log_prob-step1-rank0.pt.trace.json.gz",
        "actor_update-step1-rank0-mb1-2.pt.trace.json.gz",
    ]
    log_prob, update = files.values()
    assert numbers(log_prob, MINI_BATCH) == [0, 1]
    assert numbers(log_prob, PROFILER_STEP) == []
    assert numbers(update, MINI_BATCH) == [1, 2]  # 0 warms up; repeat 1 ends after 2
    assert [c.note for c in wp.captures] == [None, None]


def test_each_discrete_capture_counts_its_own_mini_batches(make_config: MakeConfig) -> None:
    cfg = scheduled(
        make_config,
        {"active": 1, "repeat": 1},
        global_profiler={"steps": [1, 2]},
        roles={"actor": {"discrete": True}},
    )
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    for step in (1, 2):
        with wp.global_step(step), wp.stage("actor_update"):
            for i in range(2):
                mini_batch(wp, i)
    assert list(files_of(wp, cfg)) == [
        "actor_update-step1-rank0-mb0-0.pt.trace.json.gz",
        "actor_update-step2-rank0-mb0-0.pt.trace.json.gz",
    ]


def test_window_ending_in_an_active_cycle_flushes_the_part_recorded(
    make_config: MakeConfig,
) -> None:
    cfg = scheduled(make_config, {"wait": 1, "warmup": 0, "active": 3}, roles={"actor": {}})
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    with wp.global_step(1):
        mini_batch(wp, 0)
        mini_batch(wp, 1)
        mini_batch(wp, 2, step=False)  # the step ends inside mini-batch 2

    (capture,) = wp.captures
    assert capture.state == "done"
    assert capture.note == (
        "schedule cycle cut at mini-batch 2: the window ended inside it (mini-batches 1-2 written)"
    )
    (trace,) = files_of(wp, cfg).values()
    assert trace.name == "actor-step1-rank0-mb1-2.pt.trace.json.gz"
    assert numbers(trace, MINI_BATCH) == [1, 2]


@pytest.mark.parametrize(("mini_batches", "phase"), [(0, "skip"), (1, "wait"), (2, "warmup")])
def test_window_ending_before_any_active_mini_batch_writes_no_trace(
    make_config: MakeConfig, mini_batches: int, phase: str
) -> None:
    cfg = scheduled(
        make_config,
        {"skip_first": 1, "wait": 1, "warmup": 1, "active": 1},
        roles={"actor": {}},
    )
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    with wp.global_step(1):
        for i in range(mini_batches):
            mini_batch(wp, i)

    (capture,) = wp.captures
    assert (capture.state, capture.files, capture.error) == ("done", (), None)
    assert capture.note == (
        f"the window ended at mini-batch {mini_batches}, before any active mini-batch of the "
        "schedule: no trace written"
    )
    folder = cfg.global_profiler.save_path / "step_1" / "actor" / "rank_0"
    assert [p.name for p in folder.iterdir()] == [CAPTURES_FILE]
    (record,) = json.loads((folder / CAPTURES_FILE).read_text())
    assert record["note"] == capture.note


def test_window_ending_in_wait_after_a_cycle_has_no_note(make_config: MakeConfig) -> None:
    cfg = scheduled(make_config, {"wait": 1, "warmup": 1, "active": 1}, roles={"actor": {}})
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    with wp.global_step(1):
        for i in range(4):  # 0 wait, 1 warmup, 2 active; 3 waits again
            mini_batch(wp, i)
    (capture,) = wp.captures
    assert [Path(f.path).name for f in capture.files] == [
        "actor-step1-rank0-mb2-2.pt.trace.json.gz"
    ]
    assert capture.note is None


def test_without_a_schedule_step_changes_nothing(make_config: MakeConfig) -> None:
    cfg = make_config(tool_config={"torch": {"contents": ["cpu"]}}, roles={"actor": {}})
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    wp.step()  # outside any capture
    with wp.global_step(1):
        for i in range(3):
            mini_batch(wp, i)
    (trace,) = files_of(wp, cfg).values()
    assert trace.name == "actor-step1-rank0.pt.trace.json.gz"
    assert numbers(trace, MINI_BATCH) == [0, 1, 2]
    assert numbers(trace, PROFILER_STEP) == []
