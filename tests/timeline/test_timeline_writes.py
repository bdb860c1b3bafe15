"""When and how the timeline file is written: complete after every write, also for a killed
run; a full buffer drops and counts; off means no file; what is open at close is ended there;
a failing write costs the timeline only."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from timeline_rules import (
    check_trace,
    driver,
    ended_within,
    load_trace,
    timeline_file,
)

import aprof
from aprof._timeline.writer_process import WriterProcess
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


def names(save_path: Path, cat: str = "span") -> list[str]:
    """Names of the top-level slices of ``cat`` in the run's timeline, in begin order."""
    roots = check_trace(load_trace(timeline_file(save_path)))
    return [r.name for r in sorted(roots, key=lambda r: r.begin) if r.cat == cat]


async def test_file_is_complete_after_a_mid_run_write_and_grows(make_config: MakeConfig) -> None:
    """The file written at a step's end parses and holds that step while the run goes on;
    the file at close holds it unchanged plus what came after."""
    async with aprof.Profiler(make_config()) as prof:
        async with prof.step(1):
            for i in range(5):
                with prof.span(f"first {i}"):
                    pass
        await prof.flush()
        middle = load_trace(timeline_file(prof.save_path))
        assert names(prof.save_path) == [f"first {i}" for i in range(5)]
        on_disk = aprof.load_manifest(prof.save_path).timeline
        assert [(e.path, e.events) for e in on_disk] == [
            (f"timeline/driver-{os.getpid()}.trace.json.gz", 6)  # 5 spans and the step
        ]
        async with prof.step(2):
            with prof.span("second"):
                pass
    final = load_trace(timeline_file(prof.save_path))
    assert names(prof.save_path) == [f"first {i}" for i in range(5)] + ["second"]
    assert final["traceEvents"][: len(middle["traceEvents"])] == middle["traceEvents"]
    assert final["aprofStats"]["events"] == 8
    assert not [p.name for p in (prof.save_path / "timeline").iterdir() if p.name.startswith(".")]


async def test_spans_go_to_the_writer_in_batches_and_the_buffer_bounds_a_write(
    make_config: MakeConfig,
) -> None:
    """A step of 6,000 spans crosses three batches of 2,000: every span reaches the file, in
    the order recorded; with ``buffer_events`` 4,500 the write keeps the first 4,500 and
    counts the rest as dropped, and the next write has room again."""
    async with aprof.Profiler(make_config(timeline={"buffer_events": 4500})) as prof:
        for n in (1, 2):
            async with prof.step(n):
                for i in range(6000 if n == 1 else 10):
                    with prof.span(f"s{n}", i=i):
                        pass
    trace = load_trace(timeline_file(prof.save_path))
    spans = [(r.name, r.args["i"]) for r in check_trace(trace) if r.cat == "span"]
    assert spans == [("s1", i) for i in range(4500)] + [("s2", i) for i in range(10)]
    [entry] = prof.manifest.timeline
    # Step 1's own slice, recorded as the step ends, is dropped with the last 1,500 spans.
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == ["step 2"]
    assert (entry.events, entry.dropped) == (4500 + 10 + 1, 1501)


DRIVER = """
import asyncio, sys
import aprof
from aprof.testing import RecordingTarget

async def main(save):
    prof = aprof.Profiler({"global_profiler": {"save_path": save}, "log": {"level": "error"}})
    async with prof:
        async with prof.step(1):
            for i in range(50):
                async with prof.span("kept", i=i):
                    pass
        await prof.flush()
        async with prof.step(2):
            async with prof.span("open when killed"):
                print("FLUSHED", flush=True)
                await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


def test_a_killed_run_keeps_its_last_written_timeline(tmp_path: Path) -> None:
    """SIGKILL after a write: the file on disk is that write, complete and valid, and the
    manifest lists it; the writer process sees its stdin end and ends too."""
    script, save = tmp_path / "driver.py", tmp_path / "profile"
    with driver(script, DRIVER, str(save), says=b"FLUSHED") as (proc, writers):
        assert len(writers) == 1
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert ended_within(writers, 30)
    assert names(save) == ["kept"] * 50
    [entry] = aprof.load_manifest(save).timeline
    assert entry.events == 51 and entry.bytes == timeline_file(save).stat().st_size


async def test_a_full_buffer_drops_and_counts_until_the_next_write(
    make_config: MakeConfig,
) -> None:
    """With room for 5 events between writes, 12 spans keep 5 and count 7 dropped; after a
    write the buffer takes events again; file and manifest both say how many were dropped."""
    async with aprof.Profiler(make_config(timeline={"buffer_events": 5})) as prof:
        for i in range(12):
            with prof.span(f"s{i}"):
                pass
        await prof.flush()
        async with prof.span("after the write"):
            pass
    assert names(prof.save_path) == [f"s{i}" for i in range(5)] + ["after the write"]
    assert load_trace(timeline_file(prof.save_path))["aprofStats"] | {"written_ns": 0} == {
        "events": 6,
        "dropped_events": 7,
        "written_ns": 0,
    }
    [entry] = aprof.load_manifest(prof.save_path).timeline
    assert (entry.events, entry.dropped) == (6, 7)


async def test_timeline_off_writes_nothing(make_config: MakeConfig) -> None:
    """``timeline.enable: false``: spans and requests still work, no file, no manifest entry."""
    async with aprof.Profiler(make_config(timeline={"enable": False})) as prof:
        async with prof.step(1), prof.span("turn", i=1) as span, prof.request(replica=0) as req:
            with prof.span("tool_call"):
                pass
        await prof.flush()
    assert span is not None and req.step == 1
    assert not (prof.save_path / "timeline").exists()
    assert aprof.load_manifest(prof.save_path).timeline == []


async def test_spans_open_at_close_are_ended_there_and_say_so(make_config: MakeConfig) -> None:
    """A span and a request still open when the profiler closes end at the close with a
    note; ending them later adds nothing."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def stuck() -> None:
        async with prof.span("turn"), prof.request(replica=0, request_id="late"):
            entered.set()
            await release.wait()
        with prof.span("after close"):
            pass

    async with aprof.Profiler(make_config()) as prof, prof.step(1):
        task = asyncio.create_task(stuck())
        async with asyncio.timeout(10):
            await entered.wait()
    release.set()
    async with asyncio.timeout(10):
        await task
    roots = check_trace(load_trace(timeline_file(prof.save_path)))
    notes = {(r.cat, r.name): r.args.get("note") for r in roots}
    assert notes == {
        ("span", "turn"): "open at close",
        ("request", "request replica_0"): "open at close",
    }


async def test_a_failing_write_costs_the_timeline_only(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """When ``timeline/`` cannot be created the write fails, is logged, and the run, its
    windows and its manifest go on."""
    cfg = make_config()
    cfg.global_profiler.save_path.mkdir(parents=True)
    (cfg.global_profiler.save_path / "timeline").write_text("a file in the way")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with prof.step(1), prof.request(replica=0) as req, prof.span("turn"):
            assert req.captured
        await prof.flush()
    assert "timeline write failed" in capsys.readouterr().err
    manifest = aprof.load_manifest(prof.save_path)
    assert [w.state for w in manifest.windows] == ["done"]
    assert manifest.timeline == []


async def test_an_earlier_runs_timeline_is_kept(make_config: MakeConfig) -> None:
    """A second run with the same process name moves the first run's file aside."""
    for run in ("first", "second"):
        async with aprof.Profiler(make_config(timeline={"process": "trainer"})) as prof:
            with prof.span(run):
                pass
    folder = prof.save_path / "timeline"
    traces = [p for p in folder.iterdir() if p.name.endswith(".trace.json.gz")]
    files = sorted(traces, key=lambda p: p.name != "trainer.trace.json.gz")
    assert [p.name.startswith("trainer.") for p in files] == [True, True]
    # The writes' ledgers beside it are kept aside with it.
    ledgers = sorted(p.name for p in folder.iterdir() if p.name.endswith(".ledger.jsonl"))
    assert len(ledgers) == 2 and ledgers[-1] == "trainer.ledger.jsonl"
    assert [[e["name"] for e in load_trace(p)["traceEvents"] if e["ph"] == "b"] for p in files] == [
        ["second"],
        ["first"],
    ]


async def test_spans_ending_after_close_are_ignored_however_many(
    make_config: MakeConfig,
) -> None:
    """More spans than a batch ending after the close neither raise in the code that ends
    them nor change the file."""
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("before close"):
            pass
    before = timeline_file(prof.save_path).read_bytes()
    for i in range(2500):
        with prof.span("after close", i=i):
            pass
    assert timeline_file(prof.save_path).read_bytes() == before
    assert names(prof.save_path) == ["before close"]


async def test_a_long_run_writes_its_timeline_in_parts(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part that passes its size is complete and the next write starts the next part, so a
    write never copies more than one part: every part is a whole trace with the process's
    name and clock, the manifest lists them all, and together they hold every span once.
    (The writer thread writes here, with parts of 4 kB: the limit lives in its process.)"""
    monkeypatch.setattr("aprof._timeline.chrome_trace._PART_BYTES", 4096)
    monkeypatch.setattr(WriterProcess, "shared", classmethod(lambda cls: None))
    async with aprof.Profiler(make_config(global_profiler={"steps": []})) as prof:
        for n in range(1, 13):
            async with prof.step(n):
                for i in range(60):
                    with prof.span("turn", n=n, i=i, text="x" * 20):
                        pass
            await prof.flush()
    entries = aprof.load_manifest(prof.save_path).timeline
    process = f"driver-{os.getpid()}"
    assert len(entries) > 2
    assert [e.path for e in entries] == [f"timeline/{process}.trace.json.gz"] + [
        f"timeline/{process}.{k}.trace.json.gz" for k in range(2, len(entries) + 1)
    ]
    seen = []
    for entry in entries:
        data = load_trace(prof.save_path / entry.path)
        assert data["aprof"]["process"] == process
        assert data["aprofStats"]["events"] == entry.events
        assert entry.bytes == (prof.save_path / entry.path).stat().st_size
        seen += [(r.args["n"], r.args["i"]) for r in check_trace(data) if r.cat == "span"]
    assert sorted(seen) == [(n, i) for n in range(1, 13) for i in range(60)]


async def test_events_of_a_failed_write_wait_for_the_next(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (here the folder is squatted by a file) loses nothing: once the way
    is clear, the next write holds the spans of both steps."""
    monkeypatch.setattr(WriterProcess, "shared", classmethod(lambda cls: None))
    async with aprof.Profiler(make_config(global_profiler={"steps": []})) as prof:
        folder = prof.save_path / "timeline"
        folder.write_bytes(b"")  # not a folder: the write fails
        async with prof.step(1):
            with prof.span("first"):
                pass
        await prof.flush()
        assert prof.manifest.timeline == []
        folder.unlink()
        async with prof.step(2):
            with prof.span("second"):
                pass
    assert names(prof.save_path) == ["first", "second"]
    [entry] = aprof.load_manifest(prof.save_path).timeline
    assert (entry.events, entry.dropped) == (4, 0)  # two spans, two steps
