"""Role windows at their edges: a rank that answers after its bound, discrete roles in a
continuous run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

import aprof

MakeConfig = Callable[..., aprof.ProfilerConfig]
T = TypeVar("T")


class IdleRank:
    """A rank that begins and ends at once and captures nothing."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    async def begin(self, step: int) -> None:
        return None

    async def end(self) -> list[aprof.WorkerCapture]:
        return []

    async def timeline(self) -> aprof.WorkerTimeline | None:
        return None


class RayLikeWorker:
    """A double of a Ray actor handle over a LocalWorker (Ray cannot be told to be late on cue).

    As with a Ray actor: a call the driver stops awaiting is not cancelled, it goes on in the
    actor; calls from one driver run in the order they were sent. ``begin`` waits for ``gate``.
    """

    def __init__(self, local: aprof.LocalWorker, gate: asyncio.Event) -> None:
        self.rank = local.rank
        self._local = local
        self._gate = gate
        self.last: asyncio.Task[Any] | None = None
        self.calls: list[str] = []

    def _send(self, call: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        previous = self.last

        async def run() -> T:
            if previous is not None:
                await asyncio.wait({previous})
            return await call()

        task = asyncio.get_running_loop().create_task(run())
        self.last = task
        return task

    async def begin(self, step: int) -> None:
        async def call() -> None:
            await self._gate.wait()
            self.calls.append(f"begin {step}")
            self._local.begin_step(step)

        await asyncio.shield(self._send(call))

    async def end(self) -> list[aprof.WorkerCapture]:
        async def call() -> list[aprof.WorkerCapture]:
            self.calls.append("end")
            return self._local.end_step()

        return await asyncio.shield(self._send(call))

    async def timeline(self) -> aprof.WorkerTimeline | None:
        return await asyncio.shield(self._send(self._local.timeline))


async def test_a_rank_that_begins_after_its_bound_is_still_ended(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(
        global_profiler={"steps": [1, 2], "wait_for_stops": True},
        roles={"actor": {"all_ranks": True}},
        timeouts={"start_s": 0.2, "stop_s": 5},
    )
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=1, world_size=2)
    gate = asyncio.Event()
    late = RayLikeWorker(aprof.LocalWorker(wp), gate)
    group = aprof.WorkerGroup("actor", [IdleRank(0), late], cfg)
    async with asyncio.timeout(30), aprof.Profiler(cfg) as prof:
        prof.add_target(group)
        async with prof.step(1):
            gate.set()  # rank 1 answers its begin now, after the group stopped waiting
            assert late.last is not None
            await late.last
            with wp.stage("update_actor"):
                torch.ones(4).sum()
        assert wp._open is None  # the late capture ended with its window, not later

    (window,) = [w for w in prof.manifest.windows if w.step == 1]
    assert late.calls[:2] == ["begin 1", "end"]
    done = [c for c in window.captures if c.state == "done"]
    assert [(c.rank, c.step, c.last_step) for c in done] == [(1, 1, 1)]
    assert [c.step for c in wp.captures[:1]] == [1]
    assert wp.captures[0].last_step == 1


def test_local_worker_closes_a_window_its_driver_never_ended(make_config: MakeConfig) -> None:
    pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [1, 2]}, roles={"actor": {}})
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0)
    local = aprof.LocalWorker(wp)
    local.begin_step(1)  # a begin the driver gave up on: no end follows
    local.begin_step(2)
    made = local.end_step()

    assert [(c.step, c.last_step, c.state) for c in wp.captures] == [(1, 1, "done"), (2, 2, "done")]
    assert [(c.step, c.last_step) for c in made] == [(2, 2)]
    assert made[0].files[0].path == "step_2/actor/rank_0/actor-step2-rank0.pt.trace.json.gz"


async def test_discrete_role_in_a_continuous_run_captures_each_step(
    make_config: MakeConfig,
) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(
        global_profiler={"steps": [1, 2], "continuous": True, "wait_for_stops": True},
        roles={"actor": {"discrete": True}},
    )
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0)
    group = aprof.WorkerGroup("actor", [aprof.LocalWorker(wp)], cfg)
    async with asyncio.timeout(30), aprof.Profiler(cfg) as prof:
        prof.add_target(group)
        for n in (1, 2):
            async with prof.step(n):
                with wp.stage("update_actor"):
                    torch.ones(4).sum()

    assert [(c.step, c.stage) for c in wp.captures] == [(1, "update_actor"), (2, "update_actor")]
    assert [c.files[0].path for c in wp.captures] == [
        f"step_{n}/actor/rank_0/update_actor-step{n}-rank0.pt.trace.json.gz" for n in (1, 2)
    ]
    windows = prof.manifest.windows
    assert [(w.step, w.state) for w in windows] == [(1, "done"), (2, "done")]
    assert [[c.step for c in w.captures] for w in windows] == [[1], [2]]
