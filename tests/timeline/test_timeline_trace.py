"""What the timeline file holds: requests, spans, steps and capture windows, in valid form.

Every test runs a real Profiler against ``RecordingTarget``s, closes it, reads the gzip file
back and replays it with ``timeline_rules.check_trace`` (header keys first, every ``b``
matched by an ``e``, ids unique among slices open together, no overlapping ``X`` on a thread).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import pytest
from timeline_rules import Slice, check_trace, load_trace, most_open_at_once, timeline_file

import aprof
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


def tracks(roots: list[Slice], cat: str) -> dict[str, list[Slice]]:
    """Top-level slices of category ``cat`` by name (Perfetto's track per name)."""
    found: dict[str, list[Slice]] = {}
    for root in roots:
        if root.cat == cat:
            found.setdefault(root.name, []).append(root)
    return found


def instants(window: Slice) -> list[str]:
    """Names of the instants inside ``window`` and its nested slices."""
    found = [i["name"] for i in window.instants]
    for child in window.children:
        found += instants(child)
    return found


async def test_concurrent_requests_are_one_span_each_with_their_outcome(
    make_config: MakeConfig,
) -> None:
    """300 requests open at once over two replicas, one gated on a starting capture: one
    slice each on its replica's track, carrying request_id, step, replica, gated, captured."""
    gate, hold = asyncio.Event(), asyncio.Event()
    first = RecordingTarget("replica_0", replica=0, start_gate=gate)
    second = RecordingTarget("replica_1", replica=1)  # not in rollout.replicas: never captured
    admitted: list[aprof.Request] = []
    everyone_in = asyncio.Event()
    n = 300

    async def one(i: int) -> aprof.Request:
        async with prof.request(replica=i % 2, request_id=f"r{i}") as req:
            admitted.append(req)
            if len(admitted) == n:
                everyone_in.set()
            await hold.wait()
        return req

    async with aprof.Profiler(make_config(rollout={"forward_steps": None})) as prof:
        prof.add_target(first)
        prof.add_target(second)
        async with prof.step(1), asyncio.timeout(10):
            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            await first.wait_calls("start")
            gate.set()
            await everyone_in.wait()
            hold.set()
            requests = await asyncio.gather(*tasks)

    roots = check_trace(load_trace(timeline_file(prof.save_path)))
    by_track = tracks(roots, "request")
    assert sorted(by_track) == ["request replica_0", "request replica_1"]
    assert [len(by_track[f"request replica_{r}"]) for r in (0, 1)] == [n // 2, n // 2]
    assert most_open_at_once(by_track["request replica_0"] + by_track["request replica_1"]) == n
    args = {s.args["request_id"]: s.args for s in by_track["request replica_0"]}
    args |= {s.args["request_id"]: s.args for s in by_track["request replica_1"]}
    for req in requests:
        assert args[req.request_id] == {
            "request_id": req.request_id,
            "step": 1,
            "replica": req.replica,
            "gated": req.gated,
            "captured": req.captured,
        }
    assert Counter((r.replica, r.gated, r.captured) for r in requests) == {
        (0, True, True): n // 2,
        (1, False, False): n // 2,
    }


async def test_spans_from_agent_loops_nest_in_time_and_keep_their_attrs(
    make_config: MakeConfig,
) -> None:
    """Turns (``async with``) and tool calls (``with``) of concurrent loops: one slice per
    span on a track per name, attrs and step as args, each tool call inside its turn."""
    loops, turns = 40, 3

    async def agent(sample: int) -> None:
        for turn in range(turns):
            async with prof.span("turn", sample=sample, turn=turn, final=turn == turns - 1):
                async with prof.request(replica=0, request_id=f"{sample}-{turn}"):
                    await asyncio.sleep(0)
                with prof.span("tool_call", tool="search", score=0.5, result=None):
                    await asyncio.sleep(0)

    async with aprof.Profiler(make_config(global_profiler={"steps": []})) as prof:
        async with prof.step(7):
            await asyncio.gather(*(agent(i) for i in range(loops)))
        async with prof.span("outside any step"):
            pass

    roots = check_trace(load_trace(timeline_file(prof.save_path)))
    spans = tracks(roots, "span")
    assert {name: len(found) for name, found in spans.items()} == {
        "turn": loops * turns,
        "tool_call": loops * turns,
        "outside any step": 1,
    }
    assert most_open_at_once(spans["turn"]) > 1
    assert spans["outside any step"][0].args == {"step": None}
    assert {(s.args["sample"], s.args["turn"]) for s in spans["turn"]} == {
        (i, t) for i in range(loops) for t in range(turns)
    }
    assert all(s.args["final"] == (s.args["turn"] == turns - 1) for s in spans["turn"])
    assert all(
        s.args == {"tool": "search", "score": 0.5, "result": None, "step": 7}
        for s in spans["tool_call"]
    )
    assert len(tracks(roots, "request")["request replica_0"]) == loops * turns
    assert all(s.begin <= s.end for s in spans["turn"] + spans["tool_call"])


async def test_windows_show_their_phases_auto_stops_and_failures(make_config: MakeConfig) -> None:
    """A window aprof auto-stops has nested starting/active/stopping slices and an auto_stop
    instant; a failed start a starting slice and a failed instant; a replica no request
    reached a skipped instant on its capture track."""
    counted = RecordingTarget("replica_0", replica=0)
    failing = RecordingTarget("replica_1", replica=1, fail_start=True)
    idle = RecordingTarget("replica_2", replica=2)
    cfg = make_config(rollout={"replicas": "all", "forward_steps": 2})
    async with aprof.Profiler(cfg) as prof:
        for target in (counted, failing, idle):
            prof.add_target(target)
        async with prof.step(1), asyncio.timeout(10):
            async with prof.request(replica=0) as req:
                assert req.captured
                counted.advance(2)
            await counted.wait_calls("stop")  # the poller saw 2 forward steps and stopped it
            async with prof.request(replica=1) as refused:  # its start failed at once
                assert not refused.gated and not refused.captured

    roots = check_trace(load_trace(timeline_file(prof.save_path)))
    captures = tracks(roots, "capture")
    (auto,) = captures["capture replica_0"]
    assert [c.name for c in auto.children] == ["starting", "active", "stopping"]
    assert [c.begin for c in auto.children] == sorted(c.begin for c in auto.children)
    assert auto.children[0].begin == auto.begin and auto.children[-1].end == auto.end
    assert instants(auto) == ["auto_stop"]
    assert [i["name"] for i in auto.children[2].instants] == ["auto_stop"]  # as stopping began
    assert auto.args | {"enforced_by": "aprof"} == {
        "step": 1,
        "target": "replica_0",
        "kind": "rollout",
        "state": "done",
        "stop_reason": "auto_stop",
        "enforced_by": "aprof",
    }
    (failed,) = captures["capture replica_1"]
    assert [c.name for c in failed.children] == ["starting"]
    assert instants(failed) == ["failed"]
    assert failed.args["state"] == "failed" and "refused" in failed.args["error"]
    (skipped,) = captures["capture replica_2"]
    assert skipped.begin == skipped.end and not skipped.children
    assert skipped.args["state"] == "skipped"


async def test_steps_are_slices_on_the_event_loop_thread(make_config: MakeConfig) -> None:
    """Each global step is one X slice on one thread, in order, saying if it was profiled."""
    async with aprof.Profiler(make_config(global_profiler={"steps": [2]})) as prof:
        for n in (1, 2, 3):
            async with prof.step(n):
                await asyncio.sleep(0)
    data = load_trace(timeline_file(prof.save_path))
    check_trace(data)
    steps = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["args"]) for e in sorted(steps, key=lambda e: e["ts"])] == [
        ("step 1", {"step": 1, "profiled": False}),
        ("step 2", {"step": 2, "profiled": True}),
        ("step 3", {"step": 3, "profiled": False}),
    ]
    assert len({(e["pid"], e["tid"]) for e in steps}) == 1


async def test_clock_anchor_places_events_on_the_wall_clock(make_config: MakeConfig) -> None:
    """The file carries the manifest's (wall, monotonic) pair as baseTimeNanoseconds and
    aprof.clock; base + ts lands a step between wall-clock reads taken around it."""
    async with aprof.Profiler(make_config(timeline={"process": "trainer.main"})) as prof:
        before = time.time_ns()
        async with prof.step(1):
            await asyncio.sleep(0)
        after = time.time_ns()
    path = prof.save_path / "timeline" / "trainer.main.trace.json.gz"
    data = load_trace(path)
    clock = prof.manifest.clock
    assert data["baseTimeNanoseconds"] == clock.wall_ns
    assert data["aprof"]["clock"] == {"wall_ns": clock.wall_ns, "monotonic_ns": clock.monotonic_ns}
    assert data["aprof"]["process"] == "trainer.main"
    (step,) = (e for e in data["traceEvents"] if e["ph"] == "X")
    begin = data["baseTimeNanoseconds"] + step["ts"] * 1000
    slack = 50_000_000  # the wall clock may be stepped between the two reads of the anchor
    assert before - slack <= begin <= begin + step["dur"] * 1000 <= after + slack
    assert [e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"] == [
        "trainer.main"
    ]
    [entry] = aprof.load_manifest(prof.save_path).timeline
    assert (entry.path, entry.process) == ("timeline/trainer.main.trace.json.gz", "trainer.main")
    assert entry.bytes == path.stat().st_size
    assert entry.events == data["aprofStats"]["events"] == 1


def test_timeline_config_is_validated() -> None:
    """timeline.process must be path-safe; buffer_events > 0."""
    for bad, where in (
        ({"process": "../x"}, "timeline.process"),
        ({"buffer_events": 0}, "timeline.buffer_events"),
        ({"enable": "yes"}, "timeline.enable"),
    ):
        with pytest.raises(aprof.ConfigError) as caught:
            aprof.load_config({"timeline": bad})
        assert caught.value.key == where
