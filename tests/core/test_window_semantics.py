"""The scheduler's semantics on recording targets: windows, gating, failures, cancellation."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.testing import RecordingTarget, assert_windows

MakeConfig = Callable[..., aprof.ProfilerConfig]


def replicas(n: int, **kwargs: Any) -> list[RecordingTarget]:
    return [RecordingTarget(f"replica_{r}", replica=r, **kwargs) for r in range(n)]


async def generate(
    prof: aprof.Profiler, target: RecordingTarget, engine_steps: int
) -> aprof.Request:
    """One request that runs ``engine_steps`` forward steps on its replica."""
    assert target.replica is not None
    async with prof.request(replica=target.replica) as req:
        target.advance(engine_steps)
    return req


async def test_discontinuous_steps_give_three_independent_windows_per_replica(
    make_config: MakeConfig,
) -> None:
    """Steps [1, 2, 5] with aprof-enforced auto-stop: one window each, exactly once."""
    cfg = make_config(
        global_profiler={"steps": [1, 2, 5]},
        rollout={"replicas": "all", "forward_steps": 3},
    )
    targets = replicas(2)
    async with aprof.Profiler(cfg) as prof:
        for t in targets:
            prof.add_target(t)
        for step in range(1, 7):
            async with prof.step(step):
                for t in targets:
                    await generate(prof, t, 3)
                    if step in (1, 2, 5):
                        await t.wait_calls("stop", len(t.stops) + 1)
    assert_windows(
        prof.manifest,
        [
            {
                "step": s,
                "target": t.name,
                "state": "done",
                "stop_reason": "auto_stop",
                "forward_steps.requested": 3,
                "forward_steps.observed": 3,
                "forward_steps.enforced_by": "aprof",
                "forward_steps.counted_from": "counter",
                "requests.admitted": 1,
            }
            for s in (1, 2, 5)
            for t in targets
        ],
    )
    for t in targets:
        assert [w.step for w in t.starts] == [1, 2, 5]
        assert t.stops == t.starts
        assert t.starts[2].dir == prof.save_path / "step_5" / "rollout" / f"replica_{t.replica}"
    record = prof.manifest.window(5, "replica_1")
    assert record is not None and record.files[0].path.startswith("step_5/rollout/replica_1/")
    assert (prof.save_path / record.files[0].path).is_file()


async def test_server_enforced_window_ends_when_the_server_stops_it(
    make_config: MakeConfig,
) -> None:
    """A target that bounds its own window ends it; aprof watches the counter, so the window
    stops when the server's capture did and a request after it is not taken for captured."""
    cfg = make_config(rollout={"delay": 2, "forward_steps": 4})
    (target,) = replicas(1, enforces_window=True)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            first = await generate(prof, target, 10)
            assert target.active is None  # the "server" stopped itself
            await target.wait_calls("stop")  # inside the step: aprof saw the counter pass
            later = await generate(prof, target, 1)
    assert first.captured and not later.captured
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "state": "done",
                "stop_reason": "auto_stop",
                "requests": {"admitted": 1, "gated": 0},
                "forward_steps": {
                    "delay": 2,
                    "requested": 4,
                    "observed": 4,
                    "enforced_by": "server",
                    "counted_from": "counter",
                },
            }
        ],
    )


async def test_server_enforced_window_without_counter_runs_to_step_end(
    make_config: MakeConfig,
) -> None:
    """With no counter to watch, the server's own bound holds and the window ends with the
    step; nothing is noted as wrong."""
    cfg = make_config(rollout={"delay": 0, "forward_steps": 2})
    (target,) = replicas(1, enforces_window=True, counter=False)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 5)
            assert target.active is None and not target.stops
    record = prof.manifest.window(1, "replica_0")
    assert record is not None and record.stop_reason == "auto_stop"
    assert record.forward_steps.enforced_by == "server"
    assert not [n for n in prof.manifest.notes if n.level == "problem"]


async def test_requests_wait_for_a_starting_window_and_are_counted(make_config: MakeConfig) -> None:
    """Requests admitted while the start is in flight wait for it and are marked gated."""
    gate = asyncio.Event()
    (target,) = replicas(1, start_gate=gate)
    async with aprof.Profiler(make_config(rollout={"forward_steps": None})) as prof:
        prof.add_target(target)
        async with prof.step(1):
            tasks = [asyncio.create_task(generate(prof, target, 1)) for _ in range(50)]
            await target.wait_calls("start")
            assert not any(t.done() for t in tasks)
            gate.set()
            reqs = await asyncio.gather(*tasks)
            late = await generate(prof, target, 1)
    assert all(r.gated and r.captured and r.step == 1 for r in reqs)
    assert not late.gated and late.captured
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "state": "done",
                "stop_reason": "step_end",
                "requests": {"admitted": 51, "gated": 50},
            }
        ],
    )


async def test_on_step_start_opens_windows_at_step_entry(make_config: MakeConfig) -> None:
    """``start: on_step`` starts every selected replica when the step begins."""
    targets = replicas(3)
    cfg = make_config(rollout={"start": "on_step", "replicas": [0, 2], "forward_steps": None})
    async with aprof.Profiler(cfg) as prof:
        for t in targets:
            prof.add_target(t)
        async with prof.step(1):
            assert [len(t.starts) for t in targets] == [1, 0, 1]
            req = await generate(prof, targets[0], 1)
            assert req.captured and not req.gated
    assert_windows(
        prof.manifest,
        [
            {"step": 1, "target": "replica_0", "state": "done"},
            {"step": 1, "target": "replica_2", "state": "done"},
        ],
    )


async def test_replica_without_requests_is_recorded_skipped(make_config: MakeConfig) -> None:
    """A selected replica that saw no request in a profiled step is listed as skipped."""
    targets = replicas(2)
    async with aprof.Profiler(make_config(rollout={"replicas": "all"})) as prof:
        for t in targets:
            prof.add_target(t)
        async with prof.step(1):
            await generate(prof, targets[0], 1)
    assert_windows(
        prof.manifest,
        [{"target": "replica_0", "state": "done"}, {"target": "replica_1", "state": "skipped"}],
    )
    assert targets[1].calls == []


async def test_unprofiled_steps_and_outside_steps_touch_nothing(make_config: MakeConfig) -> None:
    """Requests outside selected steps are neither gated nor captured, and start nothing."""
    (target,) = replicas(1)
    async with aprof.Profiler(make_config(global_profiler={"steps": [3]})) as prof:
        prof.add_target(target)
        outside = await generate(prof, target, 1)
        async with prof.step(1):
            inside = await generate(prof, target, 1)
    assert (outside.step, inside.step) == (None, 1)
    assert not (outside.captured or inside.captured or outside.gated or inside.gated)
    assert target.calls == [] and prof.manifest.windows == []


async def test_start_failure_costs_only_its_window(make_config: MakeConfig) -> None:
    """A target that raises on start fails its window; no stop is sent; others go on."""
    bad = RecordingTarget("replica_0", replica=0, fail_start=True)
    good = RecordingTarget("replica_1", replica=1)
    async with aprof.Profiler(make_config(rollout={"replicas": "all"})) as prof:
        prof.add_target(bad)
        prof.add_target(good)
        async with prof.step(1):
            failed = await generate(prof, bad, 1)
            ok = await generate(prof, good, 1)
    # Its start failed at once, inside the request that opened it: nothing to wait for.
    assert not failed.gated and not failed.captured and ok.captured
    assert bad.stops == []
    assert_windows(
        prof.manifest,
        [
            {"target": "replica_0", "state": "failed", "stop_reason": "error"},
            {"target": "replica_1", "state": "done"},
        ],
    )
    record = prof.manifest.window(1, "replica_0")
    assert record is not None and record.error is not None
    assert record.error == "start failed: TargetFault: replica_0: start refused for step 1"


async def test_hanging_start_times_out_and_releases_gated_requests(make_config: MakeConfig) -> None:
    """A start that never answers ends as ``timeout``; its gated requests go on uncaptured."""
    (target,) = replicas(1, hang_start=True)
    cfg = make_config(timeouts={"start_s": 0.05})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            reqs = await asyncio.gather(*(generate(prof, target, 1) for _ in range(5)))
    assert all(r.gated and not r.captured for r in reqs)
    assert target.stops == []
    assert_windows(prof.manifest, [{"state": "timeout", "error": "start timed out after 0.05s"}])


async def test_slow_stop_does_not_hold_the_step_but_holds_the_next_window(
    make_config: MakeConfig,
) -> None:
    """The step ends without waiting for a stop; no request waits on it; the next start does."""
    stop_gate = asyncio.Event()
    (target,) = replicas(1, stop_gate=stop_gate)
    cfg = make_config(global_profiler={"steps": [1, 2, 3]}, rollout={"forward_steps": None})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
        await target.wait_calls("stop")
        assert prof.manifest.window(1, "replica_0").state == "running"  # type: ignore[union-attr]
        async with prof.step(2):
            during_stop = await generate(prof, target, 1)
        assert not during_stop.gated and not during_stop.captured
        assert len(target.starts) == 1
        stop_gate.set()
        async with prof.step(3):
            await generate(prof, target, 1)  # opens the window, queued or starting
            await target.wait_calls("start", 2)
            after = await generate(prof, target, 1)
    assert after.captured
    assert [w.step for w in target.starts] == [1, 3]
    assert_windows(
        prof.manifest,
        [
            {"step": 1, "state": "done"},
            {"step": 2, "state": "skipped"},
            {"step": 3, "state": "done"},
        ],
    )


async def test_a_stop_reaches_its_target_ahead_of_the_next_steps_queued_work(
    make_config: MakeConfig,
) -> None:
    """Under load the event loop runs every ready task before a task that yields runs again:
    the stop of a window must not yield needlessly, or the next step's first requests wait
    a whole pass over thousands of agent loops for their window. A server that answers at
    once is stopped before the next step's queued loops take their first step."""
    (target,) = replicas(1)
    cfg = make_config(global_profiler={"steps": [1, 2]}, rollout={"forward_steps": None})
    stops_seen: list[int] = []

    async def loop() -> None:
        stops_seen.append(len(target.stops))
        await generate(prof, target, 1)

    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
        async with prof.step(2):
            await asyncio.gather(*(loop() for _ in range(50)))
    assert stops_seen == [1] * 50
    assert_windows(prof.manifest, [{"step": 1, "state": "done"}, {"step": 2, "state": "done"}])


async def test_a_counter_that_goes_back_gives_no_count(make_config: MakeConfig) -> None:
    """The server restarted during a polled window (its counter went back): the window says
    so and its observed count is null, never negative."""
    cfg = make_config(rollout={"forward_steps": 100})
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            target.advance(30)
            await generate(prof, target, 5)
            await target.wait_calls("forward_steps", 1)  # the poller's baseline, 30 or 35
            target.count = 2  # a fresh server
    record = prof.manifest.window(1, "replica_0")
    assert record is not None and record.state == "done"
    assert record.forward_steps.observed is None
    [note] = [n.text for n in prof.manifest.notes if "observed unknown" in n.text]
    assert re.search(r"counter went back from 3[05] to 2 during the window", note), note


async def test_hanging_stop_times_out(make_config: MakeConfig) -> None:
    """A stop that never returns ends as ``timeout`` once ``stop_s`` has passed."""
    (target,) = replicas(1, hang_stop=True)
    async with aprof.Profiler(make_config(timeouts={"stop_s": 0.05})) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
    assert_windows(prof.manifest, [{"state": "timeout", "error": "stop timed out after 0.05s"}])


async def test_failing_stop_is_recorded(make_config: MakeConfig) -> None:
    """A stop that raises marks the window failed with the target's message."""
    (target,) = replicas(1, fail_stop=True)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
    assert_windows(prof.manifest, [{"state": "failed", "stop_reason": "step_end"}])


async def test_step_body_error_closes_windows_and_propagates(make_config: MakeConfig) -> None:
    """An exception in the step body closes its windows (reason ``error``) and is re-raised."""
    (target,) = replicas(1)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        with pytest.raises(KeyError):
            async with prof.step(1):
                await generate(prof, target, 1)
                raise KeyError("boom")
        assert prof.current_step is None
    assert target.stops == target.starts
    assert_windows(prof.manifest, [{"state": "done", "stop_reason": "error"}])


async def test_cancelled_step_leaves_nothing_open(make_config: MakeConfig) -> None:
    """Cancelling the step body stops its windows (reason ``cancelled``) and frees the step."""
    (target,) = replicas(1)
    entered = asyncio.Event()

    async def body(prof: aprof.Profiler) -> None:
        async with prof.step(1):
            await generate(prof, target, 1)
            entered.set()
            await asyncio.Event().wait()

    async with aprof.Profiler(make_config(global_profiler={"steps": [1, 2]})) as prof:
        prof.add_target(target)
        task = asyncio.create_task(body(prof))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await target.wait_calls("stop")
        async with prof.step(2):
            await generate(prof, target, 1)
    assert_windows(
        prof.manifest,
        [{"step": 1, "state": "done", "stop_reason": "cancelled"}, {"step": 2, "state": "done"}],
    )


async def test_cancelled_gated_requests_do_not_stop_the_start(make_config: MakeConfig) -> None:
    """Requests cancelled while waiting for a start leave the window to start normally."""
    gate = asyncio.Event()
    (target,) = replicas(1, start_gate=gate)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        async with prof.step(1):
            waiting = [asyncio.create_task(generate(prof, target, 1)) for _ in range(10)]
            await target.wait_calls("start")
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            gate.set()
            req = await generate(prof, target, 1)
    assert req.captured and req.gated  # the start had not run yet when it came
    assert_windows(prof.manifest, [{"state": "done", "requests.gated": 11}])


async def test_strict_mode_raises_capture_errors(make_config: MakeConfig) -> None:
    """With ``strict: true`` a failed start reaches the caller as ``CaptureError``."""
    (target,) = replicas(1, fail_start=True)
    async with aprof.Profiler(make_config(strict=True)) as prof:
        prof.add_target(target)
        async with prof.step(1):
            with pytest.raises(aprof.CaptureError, match="start refused"):
                await generate(prof, target, 1)


async def test_strict_mode_raises_failed_stops_at_step_end(make_config: MakeConfig) -> None:
    """With ``strict: true`` the step waits for its stops and raises their failures."""
    (target,) = replicas(1, fail_stop=True)
    async with aprof.Profiler(make_config(strict=True)) as prof:
        prof.add_target(target)
        with pytest.raises(aprof.CaptureError, match="stop refused"):
            async with prof.step(1):
                await generate(prof, target, 1)


async def test_wait_for_stops_makes_the_step_wait(make_config: MakeConfig) -> None:
    """``wait_for_stops: true`` returns from the step only once its windows are final."""
    (target,) = replicas(1, stop_latency=0.01)
    cfg = make_config(global_profiler={"wait_for_stops": True})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
        assert prof.manifest.window(1, "replica_0").state == "done"  # type: ignore[union-attr]


async def test_role_windows_follow_steps_ranks_and_continuity(make_config: MakeConfig) -> None:
    """Role windows: per selected step, or per run of consecutive steps when continuous."""
    cfg = make_config(
        global_profiler={"steps": [1, 2, 5], "continuous": True},
        roles={"actor": {"ranks": [0]}},
    )
    rank0 = RecordingTarget("actor_rank0", kind="role", role="actor", rank=0)
    rank1 = RecordingTarget("actor_rank1", kind="role", role="actor", rank=1)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(rank0)
        prof.add_target(rank1)
        for step in range(1, 7):
            async with prof.step(step):
                pass
    assert rank1.calls == []
    assert [w.step for w in rank0.starts] == [1, 5]
    assert rank0.starts[0].dir == prof.save_path / "step_1" / "actor" / "rank_0"
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "target": "actor_rank0",
                "kind": "role",
                "state": "done",
                "stop_reason": "step_end",
            },
            {"step": 5, "target": "actor_rank0", "kind": "role", "state": "done"},
        ],
    )


async def test_discrete_role_windows_are_per_step(make_config: MakeConfig) -> None:
    """Without ``continuous`` each selected step is its own role window."""
    cfg = make_config(global_profiler={"steps": "1-2"}, roles={"actor": {}})
    actor = RecordingTarget("actor", kind="role")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(actor)
        for step in (1, 2):
            async with prof.step(step):
                pass
    assert [w.step for w in actor.starts] == [1, 2]
    assert actor.starts[1].dir == prof.save_path / "step_2" / "actor"


async def test_continuous_window_closes_when_steps_jump(make_config: MakeConfig) -> None:
    """A continuous window over [1, 2] ends when the driver jumps from step 1 to step 3."""
    cfg = make_config(global_profiler={"steps": [1, 2], "continuous": True}, roles={"actor": {}})
    actor = RecordingTarget("actor", kind="role")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(actor)
        async with prof.step(1):
            pass
        assert actor.stops == []
        async with prof.step(3):
            await actor.wait_calls("stop")
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "step_end"}])


async def test_run_end_closes_open_continuous_window(make_config: MakeConfig) -> None:
    """A continuous window still open when the profiler closes ends with ``run_end``."""
    cfg = make_config(global_profiler={"steps": [1, 2], "continuous": True}, roles={"actor": {}})
    actor = RecordingTarget("actor", kind="role")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(actor)
        async with prof.step(1):
            pass
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "run_end"}])


async def test_reentered_step_is_not_captured_twice(make_config: MakeConfig) -> None:
    """Entering a step a second time starts nothing new."""
    (target,) = replicas(1)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        for _ in range(2):
            async with prof.step(1):
                for _ in range(3):
                    await generate(prof, target, 1)
    assert len(target.starts) == 1 and len(prof.manifest.windows) == 1
    assert [n.text for n in prof.manifest.notes] == [
        "step 1 entered again: its windows were captured before"
    ]


async def test_misuse_raises_clear_errors(make_config: MakeConfig, tmp_path: Path) -> None:
    """Bad targets, steps and nesting are refused with a message naming the problem."""
    prof = aprof.Profiler(make_config())
    with pytest.raises(RuntimeError, match="open the profiler first"):
        async with prof.step(1):
            pass
    async with prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        with pytest.raises(ValueError, match="already registered"):
            prof.add_target(RecordingTarget("replica_0", replica=1))
        with pytest.raises(ValueError, match="already served"):
            prof.add_target(RecordingTarget("other", replica=0))
        with pytest.raises(ValueError, match="not path-safe"):
            prof.add_target(RecordingTarget("../evil", replica=2))
        with pytest.raises(TypeError, match=r"not an aprof\.CaptureTarget"):
            prof.add_target(object())  # type: ignore[arg-type]
        for rank in ("0", "../x", -1, True):
            with pytest.raises(ValueError, match="use an integer >= 0 or None"):
                prof.add_target(RecordingTarget("actor", kind="role", rank=rank))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="integers >= 1"):
            async with prof.step(0):
                pass
        with pytest.raises(RuntimeError, match="while step 1 is open"):
            async with prof.step(1), prof.step(2):
                pass


async def test_unwritable_save_path_is_reported_at_open(tmp_path: Path) -> None:
    """A save_path that cannot be created fails when the profiler opens, naming the key."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    prof = aprof.Profiler({"global_profiler": {"save_path": str(blocker / "sub")}})
    with pytest.raises(aprof.ConfigError, match=r"global_profiler\.save_path: cannot write"):
        async with prof:
            pass


async def test_manifest_on_disk_has_the_contract_keys(make_config: MakeConfig) -> None:
    """Every window entry carries exactly the design's keys; the file reads back."""
    (target,) = replicas(1)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        async with prof.step(1):
            await generate(prof, target, 1)
    data = json.loads((prof.save_path / "manifest.json").read_text())
    assert data["schema"] == "aprof.manifest/2"
    assert set(data["clock"]) == {"wall_ns", "monotonic_ns"}
    assert data["steps"] == "manifest/step_<n>.json" and "windows" not in data
    step = json.loads((prof.save_path / "manifest" / "step_1.json").read_text())
    assert step["schema"] == "aprof.step-manifest/1" and step["run_id"] == data["run_id"]
    (window,) = step["windows"]
    assert set(window) == {
        "step", "target", "kind", "tool", "requested_by", "state", "stop_reason", "started_ns",
        "stopped_ns", "forward_steps", "requests", "files", "error", "waited_for",
    }  # fmt: skip
    assert set(window["forward_steps"]) == {
        "delay", "requested", "observed", "enforced_by", "counted_from"
    }  # fmt: skip
    assert set(window["requests"]) == {"admitted", "gated"}
    assert window["started_ns"] <= window["stopped_ns"]
    assert aprof.load_manifest(prof.save_path) == prof.manifest


async def test_previous_manifest_is_kept(make_config: MakeConfig) -> None:
    """A second run into the same save_path keeps the first run's manifest beside it."""
    cfg = make_config()
    for _ in range(2):
        async with aprof.Profiler(cfg) as prof:
            pass
    kept = sorted(p.name for p in prof.save_path.glob("manifest*.json"))
    assert len(kept) == 2 and "manifest.json" in kept


def test_load_manifest_errors_name_the_file(tmp_path: Path) -> None:
    """Unreadable, malformed or foreign manifests raise ``ManifestError`` naming the file."""
    with pytest.raises(aprof.ManifestError, match="cannot read"):
        aprof.load_manifest(tmp_path)
    bad = tmp_path / "manifest.json"
    bad.write_text("{")
    with pytest.raises(aprof.ManifestError, match="not valid JSON"):
        aprof.load_manifest(bad)
    bad.write_text('{"schema": "other/1"}')
    with pytest.raises(aprof.ManifestError, match="expected schema"):
        aprof.load_manifest(bad)


class SessionTarget(RecordingTarget):
    """A target holding a resource: opened before its first start, closed with the profiler."""

    def __init__(self, *args: Any, fail_open: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opens: list[tuple[aprof.TimeoutsConfig, aprof.LimitsConfig]] = []
        self.closes = 0
        self.fail_open = fail_open

    async def open(self, timeouts: aprof.TimeoutsConfig, limits: aprof.LimitsConfig) -> None:
        self.opens.append((timeouts, limits))
        if self.fail_open:
            raise ConnectionRefusedError("connection refused")

    async def aclose(self) -> None:
        self.closes += 1


async def test_managed_targets_are_opened_once_and_closed_with_the_profiler(
    make_config: MakeConfig,
) -> None:
    """``open`` runs before the first start with the configured timeouts; ``aclose`` at the end."""
    used = SessionTarget("replica_0", replica=0)
    unused = SessionTarget("replica_1", replica=1)
    cfg = make_config(global_profiler={"steps": [1, 2], "wait_for_stops": True})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(used)
        prof.add_target(unused)
        for step in (1, 2):
            async with prof.step(step):
                await generate(prof, used, 1)
        assert used.closes == 0
    assert used.opens == [(cfg.timeouts, cfg.limits)] and used.closes == 1
    assert unused.opens == [] and unused.closes == 0
    assert isinstance(used, aprof.ManagedTarget)


async def test_failing_open_fails_the_window(make_config: MakeConfig) -> None:
    """A target whose resources cannot be acquired fails its window like a failed start."""
    target = SessionTarget("replica_0", replica=0, fail_open=True)
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(target)
        async with prof.step(1):
            req = await generate(prof, target, 1)
    assert not req.captured and target.starts == []
    assert_windows(
        prof.manifest,
        [{"state": "failed", "error": "start failed: ConnectionRefusedError: connection refused"}],
    )


async def test_an_active_window_counts_its_requests_until_asked_to_stop(
    make_config: MakeConfig,
) -> None:
    """Requests while the window starts are gated, those while it is active captured (counted
    by the gate, in C where it is), and none after the rollout ended."""
    cfg = make_config(rollout={"forward_steps": None})
    (target,) = replicas(1, start_latency=0.001)  # a start that waits, as a server's does
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            first = await generate(prof, target, 1)
            active = [await generate(prof, target, 1) for _ in range(5)]
            prof.rollout_ended()
            later = await generate(prof, target, 1)
    assert first.gated and first.captured
    assert all(req.captured and not req.gated for req in active)
    assert not later.captured and not later.gated
    assert_windows(
        prof.manifest,
        [{"step": 1, "stop_reason": "rollout_end", "requests": {"admitted": 6, "gated": 1}}],
    )


async def test_a_start_that_needs_no_wait_lets_the_first_request_go_captured(
    make_config: MakeConfig,
) -> None:
    """The first request begins its window's start at once, in its own step (eager.py): a
    start that completes without waiting leaves nothing to gate, even with thousands of
    requests arriving in the same pass of the event loop."""
    (target,) = replicas(1)
    async with aprof.Profiler(make_config(rollout={"forward_steps": None})) as prof:
        prof.add_target(target)
        async with prof.step(1):
            reqs = await asyncio.gather(*(generate(prof, target, 0) for _ in range(2000)))
    assert all(req.captured and not req.gated for req in reqs)
    assert_windows(prof.manifest, [{"step": 1, "requests": {"admitted": 2000, "gated": 0}}])
    assert prof.manifest.window(1, "replica_0").started_ns is not None  # type: ignore[union-attr]
