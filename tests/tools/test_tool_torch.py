"""The torch capture tool, for real: torch.profiler on this machine, traces parsed back."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.abc import CaptureTool
from aprof.tools import make_tool

torch = pytest.importorskip("torch")

MakeConfig = Callable[..., aprof.ProfilerConfig]


def capture(tool: CaptureTool, dir: Path, stem: str = "actor_step1") -> list[dict[str, Any]]:
    """Run a two-stage capture with a matmul in each stage; the trace's events."""
    tool.start(dir, stem)
    with tool.stage("update_actor"):
        with tool.stage("update_actor/forward"):
            torch.ones(4, 8) @ torch.ones(8, 2)
        tool.step()
    with tool.stage("compute_log_prob"):
        torch.ones(3, 3) @ torch.ones(3, 3)
    files = tool.stop()
    assert len(files) == 1
    raw = files[0].read_bytes()
    text = gzip.decompress(raw) if files[0].suffix == ".gz" else raw
    events: list[dict[str, Any]] = json.loads(text)["traceEvents"]
    return events


def ranges(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in events if e.get("cat") == "user_annotation"}


def test_trace_is_gzip_named_by_stem_and_holds_nested_stage_ranges(
    tmp_path: Path, make_config: MakeConfig
) -> None:
    tool = make_tool(make_config(tool_config={"torch": {"contents": ["cpu"]}}))
    assert isinstance(tool, CaptureTool)
    events = capture(tool, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["actor_step1.pt.trace.json.gz"]
    found = ranges(events)
    assert set(found) == {"update_actor", "update_actor/forward", "compute_log_prob"}
    outer, inner = found["update_actor"], found["update_actor/forward"]
    assert outer["ts"] <= inner["ts"]
    assert inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    assert found["compute_log_prob"]["ts"] >= outer["ts"] + outer["dur"]
    assert tool.note is None


def test_gzip_false_writes_plain_json(tmp_path: Path, make_config: MakeConfig) -> None:
    tool = make_tool(make_config(tool_config={"torch": {"contents": ["cpu"], "gzip": False}}))
    events = capture(tool, tmp_path, stem="ref_step2")
    assert [p.name for p in tmp_path.iterdir()] == ["ref_step2.pt.trace.json"]
    assert "compute_log_prob" in ranges(events)


def test_extras_reach_the_profiler(tmp_path: Path, make_config: MakeConfig) -> None:
    contents = ["cpu", "shapes", "stack", "memory"]
    tool = make_tool(make_config(tool_config={"torch": {"contents": contents}}))
    events = capture(tool, tmp_path)
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert [e["args"]["Input Dims"] for e in mm] == [[[4, 8], [8, 2]], [[3, 3], [3, 3]]]
    assert any(e.get("cat") == "python_function" for e in events)  # with_stack
    assert any(e.get("name") == "[memory]" for e in events)  # profile_memory


def test_without_extras_the_trace_has_none_of_them(tmp_path: Path, make_config: MakeConfig) -> None:
    tool = make_tool(make_config(tool_config={"torch": {"contents": ["cpu"]}}))
    events = capture(tool, tmp_path)
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert len(mm) == 2
    assert all("Input Dims" not in e["args"] for e in mm)
    assert not any(e.get("cat") == "python_function" for e in events)
    assert not any(e.get("name") == "[memory]" for e in events)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the note on a machine without CUDA")
def test_missing_activities_are_noted(tmp_path: Path, make_config: MakeConfig) -> None:
    tool = make_tool(make_config())  # default contents: cpu, cuda
    assert "update_actor" in ranges(capture(tool, tmp_path / "a"))
    assert tool.note == "cuda not recorded: torch.cuda.is_available() is False"

    shapes_only = make_tool(make_config(tool_config={"torch": {"contents": ["shapes"]}}))
    events = capture(shapes_only, tmp_path / "c")
    assert any("Input Dims" in e.get("args", {}) for e in events)
    assert shapes_only.note == "no activity left in contents: recorded cpu"

    only_cuda = make_tool(make_config(tool_config={"torch": {"contents": ["cuda"]}}))
    assert "update_actor" in ranges(capture(only_cuda, tmp_path / "b"))
    assert only_cuda.note == (
        "cuda not recorded: torch.cuda.is_available() is False; "
        "no activity left in contents: recorded cpu"
    )


def test_start_and_stop_are_guarded(tmp_path: Path, make_config: MakeConfig) -> None:
    tool = make_tool(make_config(tool_config={"torch": {"contents": ["cpu"]}}))
    with pytest.raises(RuntimeError, match="no torch capture is active"):
        tool.stop()
    tool.start(tmp_path, "a")
    with pytest.raises(RuntimeError, match="already active"):
        tool.start(tmp_path, "b")
    assert tool.stop() == [tmp_path / "a.pt.trace.json.gz"]
    with pytest.raises(RuntimeError, match="no torch capture is active"):
        tool.stop()
    # A second capture with the same tool writes its own file.
    capture(tool, tmp_path, stem="c")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.pt.trace.json.gz",
        "c.pt.trace.json.gz",
    ]


def test_a_second_capture_in_the_process_is_refused(tmp_path: Path) -> None:
    """Two torch captures at once end each other and crash the process: the second is refused."""
    first = make_tool(aprof.load_config({}))
    second = make_tool(aprof.load_config({}))
    first.start(tmp_path, "first")
    try:
        with pytest.raises(RuntimeError, match="another torch capture is active"):
            second.start(tmp_path, "second")
    finally:
        files = first.stop()
    assert [f.name for f in files] == ["first.pt.trace.json.gz"]
    second.start(tmp_path, "second")
    assert [f.name for f in second.stop()] == ["second.pt.trace.json.gz"]


def test_scheduled_capture_writes_each_cycle_and_notes_a_lost_one(
    tmp_path: Path, make_config: MakeConfig
) -> None:
    schedule = {"warmup": 1, "active": 1, "repeat": 3}
    cfg = make_config(tool_config={"torch": {"contents": ["cpu"], "schedule": schedule}})
    tool = make_tool(cfg)
    tool.start(tmp_path, "s", scheduled=True)
    # A folder where the second cycle's trace should go: its export fails, the others do not.
    (tmp_path / "s-mb3-3.pt.trace.json.gz").mkdir()
    for i in range(6):
        with torch.profiler.record_function(f"mini_batch{i}"):
            torch.ones(3, 3) @ torch.ones(3, 3)
        tool.step()
    files = tool.stop()
    assert [f.name for f in files] == ["s-mb1-1.pt.trace.json.gz", "s-mb5-5.pt.trace.json.gz"]
    with gzip.open(files[1], "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert "mini_batch5" in names and "mini_batch4" not in names
    assert tool.note is not None
    assert tool.note.startswith("mini-batches 3-3 not written: ")


def test_unscheduled_start_ignores_the_schedule(tmp_path: Path, make_config: MakeConfig) -> None:
    cfg = make_config(tool_config={"torch": {"contents": ["cpu"], "schedule": {"active": 1}}})
    events = capture(make_tool(cfg), tmp_path)  # capture() calls step() once: nothing to advance
    assert [p.name for p in tmp_path.iterdir()] == ["actor_step1.pt.trace.json.gz"]
    assert not any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)
