"""WorkerProfiler in one process: windows, stages, rank selection, failures, captures.json."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._workers import CAPTURES_FILE, WorkerProfiler, staged

MakeConfig = Callable[..., aprof.ProfilerConfig]


class RecordingTool:
    """A capture tool double: writes ``<stem>.rec.json`` listing the stages it saw."""

    name = "recording"
    note: str | None = None

    def __init__(
        self, fail_start: bool = False, fail_stop: bool = False, fail_step: bool = False
    ) -> None:
        self.fail_start = fail_start
        self.fail_stop = fail_stop
        self.fail_step = fail_step
        self.calls: list[str] = []
        self._stages: list[str] = []
        self._path: Path | None = None

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        self.calls.append(f"start {stem}" + (" scheduled" if scheduled else ""))
        if self.fail_start:
            raise RuntimeError("profiler already running")
        self._path, self._stages = dir / f"{stem}.rec.json", []

    def stop(self) -> list[Path]:
        self.calls.append("stop")
        if self.fail_stop:
            raise OSError("disk full")
        assert self._path is not None
        self._path.write_text(json.dumps(self._stages))
        return [self._path]

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.calls.append(f"stage {name}")
        self._stages.append(name)
        yield

    def step(self) -> None:
        self.calls.append("step")
        if self.fail_step:
            raise RuntimeError("schedule broke")


def roles(**per_role: dict[str, Any]) -> dict[str, Any]:
    return {"roles": per_role}


def run_steps(wp: WorkerProfiler, steps: range, stages: tuple[str, ...]) -> None:
    for n in steps:
        with wp.global_step(n):
            for name in stages:
                with wp.stage(name):
                    pass


def reports(save_path: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        p.parent.relative_to(save_path).as_posix(): json.loads(p.read_text())
        for p in sorted(save_path.rglob(CAPTURES_FILE))
    }


def test_e2e_one_capture_per_profiled_step_with_stage_ranges(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 3]}, **roles(actor={}))
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, world_size=2, tool=tool)
    run_steps(wp, range(1, 4), ("compute_log_prob", "update_actor"))

    assert [(c.step, c.stage, c.state) for c in wp.captures] == [
        (1, None, "done"),
        (3, None, "done"),
    ]
    assert [f.path for c in wp.captures for f in c.files] == [
        "step_1/actor/rank_0/actor-step1-rank0.rec.json",
        "step_3/actor/rank_0/actor-step3-rank0.rec.json",
    ]
    save_path = cfg.global_profiler.save_path
    trace = save_path / wp.captures[0].files[0].path
    assert json.loads(trace.read_text()) == ["compute_log_prob", "update_actor"]
    assert wp.captures[0].files[0].bytes == trace.stat().st_size
    assert not (save_path / "step_2").exists()


def test_discrete_one_capture_per_stage(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [2]}, **roles(actor={"discrete": True}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool())
    run_steps(wp, range(1, 4), ("compute_log_prob", "update_actor"))

    assert [(c.step, c.stage) for c in wp.captures] == [
        (2, "compute_log_prob"),
        (2, "update_actor"),
    ]
    assert [c.files[0].path for c in wp.captures] == [
        "step_2/actor/rank_0/compute_log_prob-step2-rank0.rec.json",
        "step_2/actor/rank_0/update_actor-step2-rank0.rec.json",
    ]


def test_continuous_window_covers_the_run_of_steps(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 2, 4], "continuous": True}, **roles(actor={}))
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    run_steps(wp, range(1, 6), ("update_actor",))

    assert [(c.step, c.last_step) for c in wp.captures] == [(1, 2), (4, 4)]
    assert tool.calls[:4] == [
        "start actor-step1-rank0",
        "stage update_actor",
        "stage update_actor",
        "stop",
    ]
    save_path = cfg.global_profiler.save_path
    assert json.loads((save_path / wp.captures[0].files[0].path).read_text()) == [
        "update_actor",
        "update_actor",
    ]


def test_continuous_window_with_real_torch_trace(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [1, 2], "continuous": True}, **roles(actor={}))
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    for n in (1, 2, 3):
        with wp.global_step(n), wp.stage("update_actor"):
            torch.ones(8).sum()

    (capture,) = wp.captures
    assert (capture.step, capture.last_step, capture.state) == (1, 2, "done")
    (file,) = capture.files
    assert file.path == "step_1/actor/rank_0/actor-step1-rank0.pt.trace.json.gz"
    with gzip.open(cfg.global_profiler.save_path / file.path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ranges = [e for e in events if e.get("name") == "update_actor" and e.get("ph") == "X"]
    assert len(ranges) == 2


def test_close_ends_a_run_cut_short(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 2], "continuous": True}, **roles(actor={}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool())
    run_steps(wp, range(1, 2), ("update_actor",))
    assert wp.captures == []
    wp.close()
    assert [(c.step, c.last_step, c.state) for c in wp.captures] == [(1, 1, "done")]


def test_begin_and_end_step_for_remote_drivers(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(ref={}))
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="ref", rank=0, tool=tool)
    wp.begin_step(1)
    with wp.stage("compute_ref_log_prob"):
        pass
    wp.end_step()
    assert tool.calls == ["start ref-step1-rank0", "stage compute_ref_log_prob", "stop"]


def test_a_failing_start_fails_only_that_capture(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 2]}, **roles(actor={"discrete": True}))
    tool = RecordingTool(fail_start=True)
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    done = []
    for n in (1, 2):
        with wp.global_step(n), wp.stage("update_actor"):
            done.append(n)

    assert done == [1, 2]
    assert [c.state for c in wp.captures] == ["failed", "failed"]
    assert wp.captures[0].error == "start failed: RuntimeError: profiler already running"
    assert "stop" not in tool.calls
    report = reports(cfg.global_profiler.save_path)["step_1/actor/rank_0"]
    assert report[0]["state"] == "failed" and report[0]["files"] == []


def test_a_failing_stop_fails_only_that_capture(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(actor={}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool(fail_stop=True))
    run_steps(wp, range(1, 2), ("update_actor",))
    (capture,) = wp.captures
    assert (capture.state, capture.error) == ("failed", "stop failed: OSError: disk full")


def test_training_errors_still_end_the_capture(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(actor={"discrete": True}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool())
    with pytest.raises(ZeroDivisionError), wp.global_step(1), wp.stage("update_actor"):
        _ = 1 / 0
    assert [c.state for c in wp.captures] == ["done"]


@pytest.mark.parametrize(
    ("role_cfg", "env_rank", "captures"),
    [
        ({}, "0", True),
        ({}, "1", False),
        ({"ranks": [1]}, "1", True),
        ({"all_ranks": True}, "1", True),
        ({"enable": False}, "0", False),
    ],
)
def test_rank_selection_from_env(
    make_config: MakeConfig,
    monkeypatch: pytest.MonkeyPatch,
    role_cfg: dict[str, Any],
    env_rank: str,
    captures: bool,
) -> None:
    monkeypatch.setenv("RANK", env_rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    tool = RecordingTool()
    wp = WorkerProfiler(make_config(**roles(actor=role_cfg)), role="actor", tool=tool)
    run_steps(wp, range(1, 2), ("update_actor",))
    assert (wp.rank, wp.world_size, wp.enabled) == (int(env_rank), 2, captures)
    assert bool(tool.calls) == captures
    assert bool(wp.captures) == captures


def test_rank_selection_by_argument_wins_over_env(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    tool = RecordingTool()
    wp = WorkerProfiler(make_config(**roles(actor={})), role="actor", rank=3, tool=tool)
    run_steps(wp, range(1, 2), ("update_actor",))
    assert (wp.rank, wp.world_size, wp.enabled, tool.calls) == (3, 4, False, [])


def test_defaults_without_env_and_bad_env(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    wp = WorkerProfiler(make_config(), role="actor")
    assert (wp.rank, wp.world_size, wp.enabled) == (0, 1, False)  # actor is not configured
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero' is not an integer"):
        WorkerProfiler(make_config(), role="actor")
    with pytest.raises(ValueError, match="rank 2 is not within world size 2"):
        WorkerProfiler(make_config(), role="actor", rank=2, world_size=2)


def test_stages_outside_a_profiled_step_do_nothing(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(actor={"discrete": True}))
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    with wp.stage("update_actor"):
        pass
    with wp.global_step(2), wp.stage("update_actor"):
        pass
    assert tool.calls == []


class Worker:
    """A worker in verl's shape: its profiler made in the constructor."""

    def __init__(self, profiler: WorkerProfiler) -> None:
        self.profiler = profiler

    @staged("compute_log_prob")
    def compute_log_prob(self, x: int) -> int:
        return x + 1

    @staged("update_actor")
    async def update_actor(self, x: int) -> int:
        return x * 2


async def test_decorators_and_async_stages(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(actor={"discrete": True}))
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    worker = Worker(wp)

    @wp.staged("compute_ref_log_prob")
    async def ref(x: int) -> int:
        return -x

    with wp.global_step(1):
        assert worker.compute_log_prob(1) == 2
        assert await worker.update_actor(2) == 4
        assert await ref(3) == -3
        async with wp.stage("extra"):
            pass
    assert await worker.update_actor(5) == 10  # outside a profiled step
    assert [c.stage for c in wp.captures] == [
        "compute_log_prob",
        "update_actor",
        "compute_ref_log_prob",
        "extra",
    ]


def test_captures_json_lists_every_capture_of_its_folder(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 2]}, **roles(actor={"discrete": True}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool())
    run_steps(wp, range(1, 4), ("compute_log_prob", "update_actor"))

    found = reports(cfg.global_profiler.save_path)
    assert sorted(found) == ["step_1/actor/rank_0", "step_2/actor/rank_0"]
    listed = [record for records in found.values() for record in records]
    assert len(listed) == len(wp.captures) == 4
    first = listed[0]
    assert {k: first[k] for k in ("step", "role", "rank", "stage", "state", "error")} == {
        "step": 1,
        "role": "actor",
        "rank": 0,
        "stage": "compute_log_prob",
        "state": "done",
        "error": None,
    }
    assert first["files"] == [
        {"path": "step_1/actor/rank_0/compute_log_prob-step1-rank0.rec.json", "bytes": 20}
    ]
    assert not list(cfg.global_profiler.save_path.rglob("*.tmp"))


def test_importing_the_worker_module_leaves_torch_alone() -> None:
    code = "import sys, aprof._workers.profiler; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_overlapping_roles_in_one_process_fail_the_second_capture(make_config: MakeConfig) -> None:
    cfg = make_config(**roles(actor={}, ref={"discrete": True}))
    actor_tool, ref_tool = RecordingTool(), RecordingTool()
    actor = WorkerProfiler(cfg, role="actor", rank=0, tool=actor_tool)
    ref = WorkerProfiler(cfg, role="ref", rank=0, tool=ref_tool)
    with actor.global_step(1), ref.global_step(1), ref.stage("compute_ref_log_prob"):
        pass
    (failed,) = ref.captures
    assert (failed.state, failed.error) == (
        "failed",
        "start failed: another capture is active in this process (actor step 1)",
    )
    assert ref_tool.calls == []
    assert [c.state for c in actor.captures] == ["done"]
    with ref.global_step(1), ref.stage("compute_ref_log_prob"):  # the slot is free again
        pass
    assert [c.state for c in ref.captures] == ["failed", "done"]


def test_overlapping_real_torch_captures_do_not_crash(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(**roles(actor={}, ref={}))
    actor = WorkerProfiler(cfg, role="actor", rank=0)
    ref = WorkerProfiler(cfg, role="ref", rank=0)
    with actor.global_step(1), ref.global_step(1), actor.stage("update_actor"):
        torch.ones(4).sum()
    assert [c.state for c in actor.captures + ref.captures] == ["done", "failed"]


def test_a_stage_run_twice_in_a_step_keeps_both_traces(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"steps": [1, 2]}, **roles(actor={"discrete": True}))
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=RecordingTool())
    run_steps(wp, range(1, 3), ("update_actor", "update_actor"))
    assert [Path(c.files[0].path).name for c in wp.captures] == [
        "update_actor-step1-rank0.rec.json",
        "update_actor-call2-step1-rank0.rec.json",
        "update_actor-step2-rank0.rec.json",
        "update_actor-call2-step2-rank0.rec.json",
    ]


SCHEDULE = {"torch": {"schedule": {"active": 1}}}


def test_step_reaches_only_scheduled_captures(make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {"discrete": True}}, tool_config=SCHEDULE)
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    wp.step()  # outside a step
    with wp.global_step(1):
        wp.step()  # between stages
        with wp.stage("compute_log_prob"):
            wp.step()
        with wp.stage("actor_update"):
            wp.step()
            wp.step()
        wp.step()
    assert tool.calls == [
        "start compute_log_prob-step1-rank0",
        "stage compute_log_prob",
        "stop",
        "start actor_update-step1-rank0 scheduled",
        "stage actor_update",
        "step",
        "step",
        "stop",
    ]


def test_step_on_an_unselected_rank_does_nothing(make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {}}, tool_config=SCHEDULE)
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=1, world_size=2, tool=tool)
    with wp.global_step(1):
        wp.step()
    assert tool.calls == []


def test_e2e_capture_is_scheduled_whatever_the_stages(make_config: MakeConfig) -> None:
    schedule = {"torch": {"schedule": {"active": 1, "stages": ["other"]}}}
    cfg = make_config(roles={"actor": {}}, tool_config=schedule)
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    with wp.global_step(1):
        wp.step()
    assert tool.calls == ["start actor-step1-rank0 scheduled", "step", "stop"]


def test_a_failing_step_fails_the_capture_but_still_stops_it(make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {}}, tool_config=SCHEDULE)
    tool = RecordingTool(fail_step=True)
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    with wp.global_step(1):
        wp.step()
        wp.step()  # the schedule is not advanced after a failure
    assert tool.calls == ["start actor-step1-rank0 scheduled", "step", "stop"]
    (capture,) = wp.captures
    assert (capture.state, capture.error) == ("failed", "step failed: RuntimeError: schedule broke")
    assert [Path(f.path).name for f in capture.files] == ["actor-step1-rank0.rec.json"]


def test_schedules_of_tools_other_than_the_configured_one_are_not_used(
    make_config: MakeConfig,
) -> None:
    """tool npu: the torch block's schedule is not the capture's."""
    cfg = make_config(global_profiler={"tool": "npu"}, roles={"actor": {}}, tool_config=SCHEDULE)
    tool = RecordingTool()
    wp = WorkerProfiler(cfg, role="actor", rank=0, tool=tool)
    with wp.global_step(1):
        wp.step()
    assert tool.calls == ["start actor-step1-rank0", "stop"]
