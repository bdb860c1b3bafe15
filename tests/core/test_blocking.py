"""BlockingProfiler: the profiler driven from synchronous code, with the caller running event
loops of its own (``asyncio.run``) between steps and inside them, as verl's trainer does."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Callable

import pytest

import aprof
from aprof.testing import RecordingTarget, assert_windows

MakeConfig = Callable[..., aprof.ProfilerConfig]


async def _work() -> None:
    """The caller's own async work, in an event loop it makes and closes (``asyncio.run``)."""
    await asyncio.sleep(0)


def test_a_sync_loop_that_runs_its_own_event_loops_gets_every_window(
    make_config: MakeConfig,
) -> None:
    cfg = make_config(
        global_profiler={"steps": [1, 2, 4]},
        roles={"actor": {"enable": True}},
        timeouts={"stop_s": 30, "start_s": 30},
    )
    actor = RecordingTarget("actor", kind="role", stop_latency=0.05)
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(actor)
        for n in range(1, 5):
            asyncio.run(_work())  # between steps
            with prof.step(n) as step:
                assert step == n == prof.current_step
                asyncio.run(_work())  # inside a step, as verl's auto_await does
        live = prof.manifest
    assert prof.current_step is None
    assert_windows(
        prof.manifest,
        [{"step": n, "target": "actor", "state": "done", "stop_reason": "step_end"}
         for n in (1, 2, 4)],
    )  # fmt: skip
    assert [c.window.step for c in actor.calls if c.op == "stop"] == [1, 2, 4]
    assert live is not prof.manifest  # a copy while open, the final one after
    assert aprof.load_manifest(prof.save_path).windows == prof.manifest.windows


def test_targets_join_before_or_inside_and_spans_reach_the_timeline(
    make_config: MakeConfig,
) -> None:
    cfg = make_config(roles={"actor": {"enable": True}, "critic": {"enable": True}})
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(RecordingTarget("actor", kind="role"))
        with prof.step(1), prof.span("update_actor", batch=8):
            pass
        prof.add_target(RecordingTarget("critic", kind="role"))
        with prof.step(2):
            pass
        prof.flush()
    assert_windows(prof.manifest, [{"step": 1, "target": "actor", "state": "done"}])
    [timeline] = prof.manifest.timeline
    events = json.loads(gzip.decompress((prof.save_path / timeline.path).read_bytes()))
    [span] = [e for e in events["traceEvents"] if (e.get("name"), e["ph"]) == ("update_actor", "b")]
    assert span["args"]["batch"] == 8


def test_an_error_in_a_step_closes_its_windows_and_reaches_the_caller(
    make_config: MakeConfig,
) -> None:
    cfg = make_config(roles={"actor": {"enable": True}})
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(RecordingTarget("actor", kind="role"))
        with pytest.raises(KeyError, match="batch"), prof.step(1):
            raise KeyError("batch")
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "error"}])


def test_its_life_is_open_once_then_closed(make_config: MakeConfig) -> None:
    prof = aprof.BlockingProfiler(make_config())
    with pytest.raises(RuntimeError, match="open the profiler first"):
        prof.step(1)
    with prof, pytest.raises(RuntimeError, match="opened once"):
        prof.__enter__()
    prof.close()  # again: nothing
    with pytest.raises(RuntimeError, match="open the profiler first"):
        prof.flush()
    with pytest.raises(RuntimeError, match="opened once"):
        prof.__enter__()
    assert prof.manifest.windows == []


def test_an_unwritable_save_path_is_one_clear_error(make_config: MakeConfig) -> None:
    cfg = make_config(global_profiler={"save_path": "/proc/aprof-cannot-write-here"})
    with pytest.raises(aprof.ConfigError, match=r"global_profiler\.save_path"):
        aprof.BlockingProfiler(cfg).__enter__()
    assert not [t for t in threading.enumerate() if t.name.startswith("aprof-profiler")]
