"""AgentLoopRunner: the concurrency bound, balancing, a replica going down, the async stream."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from agentloop_replicas import ReplicaFactory, Stall, samples

from agentloop import (
    AgentLoop,
    AgentLoopRunner,
    LLMClient,
    LLMError,
    Sample,
    SingleTurnLoop,
    Trajectory,
)

LIMIT_S = 20


class Gated(AgentLoop):
    """A loop without requests: each rollout waits for ``gate``; counts what runs at once."""

    def __init__(self, *, open_at: int | None = None) -> None:
        super().__init__(LLMClient(["http://127.0.0.1:1"]))
        self.gate = asyncio.Event()
        self.open_at = open_at
        self.running = 0
        self.peak = 0
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.on_start: dict[int, asyncio.Event] = {}

    async def run(self, sample: Sample) -> Trajectory:
        self.started.append(sample.id)
        self.running += 1
        self.peak = max(self.peak, self.running)
        if len(self.started) in self.on_start:
            self.on_start[len(self.started)].set()
        if len(self.started) == self.open_at:
            self.gate.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(sample.id)
            raise
        finally:
            self.running -= 1
        return Trajectory(sample=sample, step=None)


async def test_batch_runs_at_most_concurrency_rollouts_and_keeps_sample_order() -> None:
    # The gate opens when the third rollout starts: a runner without a bound would have
    # started all seven by then, since none can end before the gate opens.
    loop = Gated(open_at=3)
    async with asyncio.timeout(LIMIT_S):
        trajs = await AgentLoopRunner(loop, concurrency=3).run_batch(samples(7))
    assert loop.peak == 3
    assert [t.id for t in trajs] == [f"s{i}" for i in range(7)]
    assert await AgentLoopRunner(loop).run_batch([]) == []


async def test_new_trajectories_go_to_the_replica_with_fewest_in_flight(
    replicas: ReplicaFactory,
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [a, b],
        Stall(a) as stall,
        LLMClient([a.url, b.url]) as llm,
    ):
        busy = asyncio.create_task(llm.generate("hold", max_tokens=2, prefer=0))
        await stall.entered.wait()
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=2), concurrency=1)
        trajs = await runner.run_batch(samples(3))
        assert llm.balancer.in_flight == (1, 0)
        stall.release()
        assert (await busy).replica == 0
    assert [t.turns[0].replica for t in trajs] == [1, 1, 1]


async def test_a_replica_going_down_mid_step_fails_only_its_trajectories(
    replicas: ReplicaFactory,
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [a, b],
        Stall(a) as stall,
        LLMClient([a.url, b.url], avoid_s=600) as llm,
    ):
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=3), concurrency=6)
        step = asyncio.create_task(runner.run_batch(samples(6)))
        await stall.entered.wait()  # some of the step's requests are inside a's engine
        stopping = asyncio.create_task(a.stop())
        trajs = await step
        stall.release()  # a's engine closes only once its held forward pass may end
        await stopping
        after = await runner.run_batch(samples(4, prefix="next"))
    failed = [t for t in trajs if not t.ok]
    assert failed, "the requests held in a's engine must fail"
    for traj in failed:
        assert isinstance(traj.error, LLMError) and traj.turns == []
        assert (traj.error.replica, traj.error.kind) == (0, "disconnected")
    done = [t for t in trajs if t.ok]
    assert {t.turns[0].replica for t in done} <= {1}
    # Each request was sent once: a's failures were not re-sent to b.
    assert (len(a.received), len(b.received)) == (len(failed), len(done) + 4)
    # New trajectories avoid the replica that went down, without trying it first.
    assert all(t.ok and t.turns[0].replica == 1 for t in after)
    assert all(t.turns[0].completion.failed_over_from == () for t in after)


async def test_stream_hands_over_every_trajectory_then_reports_exhaustion() -> None:
    loop = Gated(open_at=1)
    async with asyncio.timeout(LIMIT_S):
        async with AgentLoopRunner(loop, concurrency=2).stream(samples(5)) as rollouts:
            first = await rollouts.take(3)
            rest = await rollouts.take(3)
            assert await rollouts.take(1) == []
            assert rollouts.exhausted
    assert sorted(t.id for t in first + rest) == [f"s{i}" for i in range(5)]
    assert len(first) == 3 and len(rest) == 2


async def test_stream_starts_no_rollout_while_the_buffer_is_full() -> None:
    loop = Gated()
    loop.gate.set()
    second, third = asyncio.Event(), asyncio.Event()
    loop.on_start = {2: second, 3: third}
    runner = AgentLoopRunner(loop, concurrency=1)
    async with asyncio.timeout(LIMIT_S), runner.stream(samples(10), max_buffered=2) as rollouts:
        await second.wait()  # the worker ran on until the full buffer stopped it
        assert (len(loop.started), rollouts.buffered) == (2, 2)
        [taken] = await rollouts.take(1)
        await third.wait()
    assert taken.id == "s0"
    assert len(loop.started) == 3


async def test_leaving_the_stream_cancels_rollouts_in_flight() -> None:
    loop = Gated()
    started = asyncio.Event()
    loop.on_start = {2: started}
    runner = AgentLoopRunner(loop, concurrency=2)
    with pytest.raises(KeyError, match="trainer failed"):
        async with asyncio.timeout(LIMIT_S), runner.stream(itertools.repeat(Sample("x", "p"))):
            await started.wait()
            raise KeyError("trainer failed")
    assert loop.cancelled == ["x", "x"] and loop.running == 0


async def test_take_times_out_without_losing_what_finishes_later() -> None:
    loop = Gated()
    runner = AgentLoopRunner(loop, concurrency=2)
    async with asyncio.timeout(LIMIT_S), runner.stream(samples(2)) as rollouts:
        with pytest.raises(TimeoutError):
            await rollouts.take(1, timeout_s=0.01)
        loop.gate.set()
        taken = await rollouts.take(2)
    assert Counter(t.id for t in taken) == Counter(["s0", "s1"])


async def test_runner_arguments_are_checked() -> None:
    runner = AgentLoopRunner(Gated())
    with pytest.raises(ValueError, match="concurrency"):
        AgentLoopRunner(Gated(), concurrency=0)
    with pytest.raises(ValueError, match="max_staleness"):
        runner.stream([], max_staleness=-1)
    with pytest.raises(ValueError, match="max_buffered"):
        runner.stream([], max_buffered=0)
    async with asyncio.timeout(LIMIT_S), runner.stream([]) as rollouts:
        with pytest.raises(ValueError, match="k must be"):
            await rollouts.take(0)
