"""Rollouts under a Profiler: gating, stops that never hold requests, selected steps, the
timeline, and requests that cross a step boundary in fully-async mode.

The capture targets are aprof.testing.RecordingTarget (gates, no torch: two torch profilers in
one process crash it); the requests go to real reference servers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from agentloop_replicas import ReplicaFactory, Stall, samples

import aprof
from agentloop import (
    AgentLoop,
    AgentLoopRunner,
    LLMClient,
    Sample,
    ScriptedToolCalls,
    SingleTurnLoop,
    ToolAgentLoop,
    Trajectory,
    calculator,
    search,
)
from aprof.testing import RecordingTarget, assert_windows

LIMIT_S = 30
MakeConfig = Callable[..., aprof.ProfilerConfig]


async def test_requests_admitted_while_a_window_starts_wait_and_are_marked_gated(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    gate = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, start_gate=gate)
    cfg = make_config(rollout={"replicas": [0], "forward_steps": None}, timeouts={"start_s": 30})
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(cfg) as prof,
        LLMClient([server.url], prof=prof) as llm,
    ):
        prof.add_target(target)
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=2), concurrency=4)
        async with prof.step(1):
            batch = asyncio.create_task(runner.run_batch(samples(4)))
            await target.wait_calls("start")
            assert server.received == []  # all four wait for the capture to start
            assert llm.balancer.in_flight == (4,)
            gate.set()
            trajs = await batch
    for traj in trajs:
        turn = traj.turns[0].completion
        assert (turn.step, turn.gated, turn.captured) == (1, True, True)
    assert len(server.received) == 4
    # The usage the server answered with, on the request: the accounting has it.
    (account,) = aprof.report(prof.save_path, html=False).accounts
    (replica,) = account.replicas
    completions = [t.turns[0].completion for t in trajs]
    assert replica.prompt_tokens == sum(c.prompt_tokens or 0 for c in completions) > 0
    assert replica.tokens == sum(c.completion_tokens or 0 for c in completions) > 0
    # Each request names its trajectory and turn: the slowest say which they were.
    assert {(s.trajectory, s.turn) for s in account.slowest} == {(t.id, 0) for t in trajs}
    assert_windows(
        prof.manifest,
        [{"step": 1, "target": "replica_0", "state": "done", "requests.gated": 4,
          "requests.admitted": 4}],
    )  # fmt: skip


async def test_requests_never_wait_on_a_stop(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    stop_gate = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, stop_gate=stop_gate)
    cfg = make_config(
        global_profiler={"steps": [1, 2]}, rollout={"replicas": [0], "forward_steps": 1}
    )
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(cfg) as prof,
        LLMClient([server.url], prof=prof) as llm,
    ):
        prof.add_target(target)
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=2), concurrency=4)
        async with prof.step(1):
            captured = await runner.run_batch(samples(4, prefix="a"))
            target.advance(1)  # one engine forward step: aprof auto-stops the window
            await target.wait_calls("stop")  # ... and the stop is held
            during_stop = await runner.run_batch(samples(4, prefix="b"))
        async with prof.step(2):  # its window queues behind the held stop
            next_step = await runner.run_batch(samples(4, prefix="c"))
        assert not stop_gate.is_set()
        stop_gate.set()
    assert all(t.turns[0].completion.captured for t in captured)
    for traj in during_stop + next_step:
        assert traj.ok
        assert (traj.turns[0].completion.gated, traj.turns[0].completion.captured) == (False, False)
    assert len(server.received) == 12
    assert_windows(
        prof.manifest,
        [{"step": 1, "state": "done", "stop_reason": "auto_stop", "requests.admitted": 4}],
        exact=False,
    )


def _timeline(prof: aprof.Profiler) -> list[dict[str, Any]]:
    [path] = (prof.save_path / "timeline").glob("*.trace.json.gz")
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "b"]


async def test_windows_only_for_selected_steps_and_turns_on_the_timeline(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    selected = [1, 2, 5]
    targets = [RecordingTarget(f"replica_{r}", replica=r) for r in (0, 1)]
    cfg = make_config(
        global_profiler={"steps": selected, "wait_for_stops": True},
        rollout={"replicas": "all", "forward_steps": None},
    )
    trajs: dict[int, list[Trajectory]] = {}
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2, dialect="sglang") as [a, b],
        aprof.Profiler(cfg) as prof,
        LLMClient([a.url, b.url], api="sglang", prof=prof) as llm,
    ):
        for target in targets:
            prof.add_target(target)
        loop = ToolAgentLoop(
            llm, [calculator, search], parser=ScriptedToolCalls(1), max_turns=2, max_tokens=2
        )
        runner = AgentLoopRunner(loop, concurrency=4)
        for n in range(1, 7):
            async with prof.step(n):
                trajs[n] = await runner.run_batch(samples(4, prefix=f"step{n}-"))
    assert [[w.step for w in t.starts] for t in targets] == [selected, selected]
    expected = []
    for n, batch in trajs.items():
        for traj in batch:
            assert traj.ok and traj.step == n and len(traj.turns) == 2
            for turn in traj.turns:
                assert (turn.step, turn.completion.captured) == (n, n in selected)
        if n in selected:
            per_replica = Counter(turn.replica for traj in batch for turn in traj.turns)
            expected += [
                {"step": n, "target": f"replica_{r}", "state": "done", "stop_reason": "step_end",
                 "requests.admitted": per_replica[r]}
                for r in (0, 1)
            ]  # fmt: skip
    assert_windows(prof.manifest, expected)

    spans = _timeline(prof)
    turns = {(e["args"]["trajectory"], e["args"]["turn"], e["args"]["step"]) for e in spans
             if e["cat"] == "span" and e["name"] == "turn"}  # fmt: skip
    requests = {e["args"]["request_id"] for e in spans if e["cat"] == "request"}
    tools = Counter(e["args"]["tool"] for e in spans if e["name"] == "tool_call")
    everything = [(traj, turn) for batch in trajs.values() for traj in batch for turn in traj.turns]
    assert turns == {(traj.id, turn.index, traj.step) for traj, turn in everything}
    assert requests == {turn.completion.request_id for _, turn in everything}
    assert tools == {"calculator": 6 * 4}


@contextlib.asynccontextmanager
async def _held_across_a_step_boundary(
    replicas: ReplicaFactory, make_config: MakeConfig, max_staleness: int
) -> Any:
    """Rollouts begun in step 1 whose first requests are held in the engine until step 2."""
    cfg = make_config(global_profiler={"steps": [1, 2]})
    async with (
        replicas(1) as [server],
        Stall(server) as stall,
        aprof.Profiler(cfg) as prof,
        LLMClient([server.url], prof=prof) as llm,
        contextlib.AsyncExitStack() as stack,
    ):
        loop = ToolAgentLoop(
            llm, [calculator], parser=ScriptedToolCalls(1), max_turns=2, max_tokens=2
        )
        runner = AgentLoopRunner(loop, concurrency=3)
        async with prof.step(1):
            rollouts = await stack.enter_async_context(
                runner.stream(samples(3), max_staleness=max_staleness)
            )
            await stall.entered.wait()  # first turns are in the engine, admitted in step 1
        async with prof.step(2):
            stall.release()
            yield rollouts


async def test_fully_async_requests_belong_to_the_step_they_were_admitted_in(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        _held_across_a_step_boundary(replicas, make_config, max_staleness=1) as rollouts,
    ):
        trajs = await rollouts.take(3)
    assert len(trajs) == 3 and rollouts.dropped == 0
    for traj in trajs:
        # Turn 0 was admitted in step 1 and finished in step 2; turn 1 began in step 2.
        assert traj.ok and traj.step == 1
        assert [turn.step for turn in traj.turns] == [1, 2]


async def test_fully_async_drops_rollouts_staler_than_the_bound(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        _held_across_a_step_boundary(replicas, make_config, max_staleness=0) as rollouts,
    ):
        taken = await rollouts.take(1)
    assert taken == [] and rollouts.dropped == 3 and rollouts.exhausted


@pytest.mark.parametrize("enable", [False, True])
async def test_turn_and_tool_spans_follow_the_timeline_switch(
    replicas: ReplicaFactory, make_config: MakeConfig, enable: bool
) -> None:
    cfg = make_config(timeline={"enable": enable})
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(cfg) as prof,
        LLMClient([server.url], prof=prof) as llm,
    ):
        loop = ToolAgentLoop(
            llm, [search], parser=ScriptedToolCalls(1, tools=["search"]), max_tokens=2
        )
        [traj] = await AgentLoopRunner(loop).run_batch(samples(1))
    assert traj.ok and traj.turns[0].tool_results[0].ok
    names = [e["name"] for e in _timeline(prof)] if enable else []
    assert not (prof.save_path / "timeline").exists() or enable
    assert Counter(names)["turn"] == (2 if enable else 0)
    assert Counter(names)["tool_call"] == (1 if enable else 0)


class _RaisesWhenLetGo(AgentLoop):
    """A broken loop: a rollout waits for ``gate``, then raises without a trajectory."""

    def __init__(self, llm: LLMClient) -> None:
        super().__init__(llm)
        self.began = asyncio.Event()
        self.gate = asyncio.Event()

    async def run(self, sample: Sample) -> Trajectory:
        self.began.set()
        await self.gate.wait()
        raise RuntimeError("broken loop")


async def test_a_loop_that_raises_in_a_later_step_keeps_the_step_it_began_in(
    make_config: MakeConfig,
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        aprof.Profiler(make_config()) as prof,
        contextlib.AsyncExitStack() as stack,
    ):
        # Never opened: the loop sends no request.
        loop = _RaisesWhenLetGo(LLMClient(["http://127.0.0.1:1"], prof=prof))
        runner = AgentLoopRunner(loop, concurrency=1)
        async with prof.step(1):
            rollouts = await stack.enter_async_context(runner.stream(samples(1), max_staleness=1))
            await loop.began.wait()
        async with prof.step(2):
            loop.gate.set()
            [traj] = await rollouts.take(1)
    assert isinstance(traj.error, RuntimeError) and traj.step == 1
