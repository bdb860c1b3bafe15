"""Edges of the timeline: requests that never got in, steps cut short by the close, the
header Perfetto reads, and the manifest entry of a write against its file."""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from timeline_rules import check_trace, load_trace, timeline_file

import aprof
from aprof._manifest import Clock
from aprof._timeline.chrome_trace import ChromeTraceWriter
from aprof._timeline.events import SPAN
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


async def test_a_request_cancelled_while_gated_ends_there(make_config: MakeConfig) -> None:
    """A request cancelled while it waits for its replica's capture to start is recorded as
    ended at the cancel, with its note; it is not left open until the profiler closes."""
    gate = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, start_gate=gate)
    entered = asyncio.Event()

    async def gated() -> None:
        entered.set()
        async with prof.request(replica=0, request_id="cancelled"):
            pass

    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        async with prof.step(1), asyncio.timeout(10):
            task = asyncio.create_task(gated())
            await target.wait_calls("start")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gate.set()
        with prof.span("after the step"):
            pass
    roots = check_trace(load_trace(timeline_file(prof.save_path)))
    (request,) = [r for r in roots if r.cat == "request"]
    (after,) = [r for r in roots if r.name == "after the step"]
    assert request.args["note"] == "CancelledError"
    assert request.args["gated"] is True and request.args["captured"] is False
    assert request.end <= after.begin


async def test_a_step_closed_by_the_profiler_is_one_slice(make_config: MakeConfig) -> None:
    """The profiler closes while a step is open in another task, and that step's body ends
    while the close waits for a stop: the step is one X slice, not two overlapping ones."""
    stop_gate = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, stop_gate=stop_gate)
    in_step, leave = asyncio.Event(), asyncio.Event()

    async def driver() -> None:
        async with prof.step(1):
            async with prof.request(replica=0):
                in_step.set()
            await leave.wait()

    prof = aprof.Profiler(make_config(rollout={"forward_steps": None}))
    async with prof, asyncio.timeout(10):
        prof.add_target(target)
        task = asyncio.create_task(driver())
        await in_step.wait()
        closing = asyncio.create_task(prof.aclose())
        await target.wait_calls("stop")  # the close ended the step and waits for the stop
        leave.set()
        await task  # the step's own end runs while the close still waits
        stop_gate.set()
        await closing
    data = load_trace(timeline_file(prof.save_path))
    check_trace(data)
    assert [e["name"] for e in data["traceEvents"] if e["ph"] == "X"] == ["step 1"]


async def test_timestamps_are_not_declared_as_nanoseconds(make_config: MakeConfig) -> None:
    """``ts`` is in microseconds; older Perfetto trace processors read every ``ts`` as
    nanoseconds when the file starts with ``"displayTimeUnit":"ns"``, so it starts with
    ``"ms"``."""
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("one"):
            pass
    path = timeline_file(prof.save_path)
    assert gzip.decompress(path.read_bytes()).startswith(b'{"displayTimeUnit":"ms",')
    assert load_trace(path)["displayTimeUnit"] == "ms"


async def test_the_manifest_entry_describes_the_file_it_names(make_config: MakeConfig) -> None:
    """Spans dropped after the last write are not in the file: the manifest, rewritten for
    a window change in between, still gives the file's own counts."""
    async with aprof.Profiler(make_config(timeline={"buffer_events": 2})) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for i in range(3):
            with prof.span(f"s{i}"):
                pass
        await prof.flush()
        written = load_trace(timeline_file(prof.save_path))["aprofStats"]
        for i in range(5):  # fill the buffer again and drop 3 more
            with prof.span(f"t{i}"):
                pass
        async with prof.step(1), prof.request(replica=0):  # window changes rewrite it
            on_disk = aprof.load_manifest(prof.save_path).timeline
            stats = load_trace(timeline_file(prof.save_path))["aprofStats"]
            assert stats == written
            assert [(e.events, e.dropped) for e in on_disk] == [
                (stats["events"], stats["dropped_events"])
            ]
            assert on_disk[0].bytes == timeline_file(prof.save_path).stat().st_size


def test_a_file_no_longer_as_written_is_begun_again(tmp_path: Path) -> None:
    """A timeline file cut short (or removed, or replaced) behind the writer's back cannot be
    extended: the next write begins it again with that write's events, counts what the old
    file held as dropped, and leaves no temporary file."""
    folder = tmp_path / "timeline"
    clock = Clock(wall_ns=0, monotonic_ns=0)
    writer = ChromeTraceWriter(
        folder / "p.trace.json.gz", root=tmp_path, process="p", clock=clock, pid=os.getpid(), tid=1
    )
    writer.add([(SPAN, "a", 0, 1, None, None)])
    writer.write(0)
    (folder / "p.trace.json.gz").write_bytes(b"")  # shorter than written
    writer.add([(SPAN, "b", 2, 3, None, None)])
    writer.write(0)
    data = load_trace(folder / "p.trace.json.gz")
    assert [r.name for r in check_trace(data)] == ["b"]
    assert (data["aprofStats"]["events"], data["aprofStats"]["dropped_events"]) == (1, 1)
    # Nothing else left behind: the file and its writes' ledgers (appended from the first).
    assert sorted(p.name for p in folder.iterdir()) == ["p.ledger.jsonl", "p.trace.json.gz"]
    assert (writer.written.events, writer.written.dropped) == (1, 1)
