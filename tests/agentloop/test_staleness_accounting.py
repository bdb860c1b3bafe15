"""The fully-async stream in the report's accounting: every step accounted, the staleness of
what the trainer took counted in the step that took it, and training that overlaps rollouts.

A real run: a reference server on 127.0.0.1, a real ``aprof.Profiler`` with its timeline, the
runner's stream across steps, a trainer stage per step; then ``aprof._report.collect``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agentloop_replicas import Replica, ReplicaFactory, samples

import aprof
from agentloop import (
    AgentLoopRunner,
    LLMClient,
    Sample,
    ScriptedToolCalls,
    SingleTurnLoop,
    ToolAgentLoop,
    Trajectory,
    calculator,
)
from aprof._report import collect
from servers.reference.engine import StepInfo

LIMIT_S = 120
STEPS = 4
WORKERS = 3
"""Rollouts at once; also what each step takes, and the buffer's bound (its default)."""
MAX_STALENESS = 1
MakeConfig = Callable[..., aprof.ProfilerConfig]


class _ForwardPasses:
    """Says when the replica's engine begins a forward pass: a request is in flight then (it
    was sent before and is answered after)."""

    def __init__(self, replica: Replica) -> None:
        self._loop = asyncio.get_running_loop()
        self._armed: asyncio.Event | None = None
        replica.engine.step_hooks.append(self._hook)

    def _hook(self, info: StepInfo) -> None:  # on the engine's thread
        armed = self._armed  # read once: a pass seen by an earlier wait sets that wait's event
        if armed is not None:
            self._loop.call_soon_threadsafe(armed.set)

    async def next(self) -> None:
        """Return once a forward pass began after this call did."""
        self._armed = armed = asyncio.Event()
        try:
            await armed.wait()
        finally:
            self._armed = None


def _endless() -> Iterator[Sample]:
    for i in itertools.count():
        yield Sample(id=f"s{i}", prompt=f"Question: what is 6 * 7? #{i}")


def _timeline_spans(prof: aprof.Profiler, name: str) -> list[dict[str, Any]]:
    [path] = (prof.save_path / "timeline").glob("*.trace.json.gz")
    events: list[dict[str, Any]] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return [e for e in events if e.get("ph") == "b" and e["cat"] == "span" and e["name"] == name]


async def test_fully_async_steps_account_staleness_and_training_overlapping_rollouts(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    cfg = make_config(global_profiler={"steps": [2]})
    batches: dict[int, list[Trajectory]] = {}
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(cfg) as prof,
        LLMClient([server.url], prof=prof) as llm,
        contextlib.AsyncExitStack() as stack,
    ):
        passes = _ForwardPasses(server)
        loop = ToolAgentLoop(
            llm, [calculator], parser=ScriptedToolCalls(1), max_turns=2, max_tokens=2
        )
        runner = AgentLoopRunner(loop, concurrency=WORKERS)
        for n in range(1, STEPS + 1):
            async with prof.step(n):
                if n == 1:  # opened in step 1: every rollout begun before step 2 has step 1
                    rollouts = await stack.enter_async_context(
                        runner.stream(_endless(), max_staleness=MAX_STALENESS)
                    )
                batches[n] = await rollouts.take(WORKERS)
                # A stand-in policy update that lasts until the engine began a forward pass
                # after it did: some request was in flight while it ran, by construction.
                async with prof.stage("update_policy"):
                    await passes.next()

    accounts = collect(prof.save_path).accounts
    assert [a.step for a in accounts] == list(range(1, STEPS + 1))
    for a in accounts:
        assert a.profiled == (a.step == 2)
        assert a.train_s > 0 and a.overlap_s > 0, a
        assert a.rollout_s + a.train_s - a.overlap_s + a.idle_s == pytest.approx(a.wall_s, abs=1e-3)
        # What the runner handed over in the step, counted there.
        stale = [a.step - t.step for t in batches[a.step] if t.step is not None]
        assert all(0 <= s <= MAX_STALENESS for s in stale)  # fresher ones only, steps go up
        if stale:
            assert a.staleness == {
                "count": len(stale),
                "mean": pytest.approx(sum(stale) / len(stale)),
                "max": max(stale),
            }
        else:
            assert a.staleness is None
    by_step = {a.step: a.staleness for a in accounts}
    # Step 1 takes rollouts begun in step 1. Step 2 takes the oldest finished first: one begun
    # in step 1 (left in the buffer, or else the first to finish after step 1: a worker
    # begins no other rollout before it finished the one it runs).
    assert by_step[1] == {"count": WORKERS, "mean": 0.0, "max": 0.0}
    assert by_step[2] is not None and by_step[2]["max"] == MAX_STALENESS

    # One zero-length span per trajectory taken, in the step that took it.
    spans = _timeline_spans(prof, "trajectory")
    recorded = sorted(
        (e["args"]["sample"], e["args"]["step"], e["args"]["staleness"]) for e in spans
    )
    taken = [
        (t.id, n, n - t.step) for n, batch in batches.items() for t in batch if t.step is not None
    ]
    assert recorded == sorted(taken)


async def test_a_take_outside_any_step_records_no_staleness(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(make_config()) as prof,
        LLMClient([server.url], prof=prof) as llm,
        contextlib.AsyncExitStack() as stack,
    ):
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=2), concurrency=2)
        async with prof.step(1):
            # Both rollouts begin in step 1 (the workers start while take waits).
            rollouts = await stack.enter_async_context(runner.stream(samples(2)))
            [inside] = await rollouts.take(1)
        [outside] = await rollouts.take(1)
    assert inside.step == outside.step == 1
    spans = _timeline_spans(prof, "trajectory")
    assert [(e["args"]["sample"], e["args"]["step"], e["args"]["staleness"]) for e in spans] == [
        (inside.id, 1, 0)
    ]
