"""Every step's accounting from the timelines of three processes, on a real local Ray cluster.

Two Ray async actors and the driver each hold several requests in flight together, over two
replicas, in each of two steps; the driver then runs a trainer stage. The report's
``accounts`` are checked against unions recomputed here from the raw timeline files: rollout
time is the union of every request span within the step (never their sum), each replica's
busy time the union of its own.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import aprof
import aprof.ray
from aprof._report import collect

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")

pytestmark = pytest.mark.usefixtures("ray_cluster")

LIMIT_S = 120
COUNT = 6
"""Requests each process holds in flight together per step."""
REPLICAS = 2
TURNS = 3
"""Event-loop turns each request stays open for, before and after it is released."""
STEPS = (1, 2)
STAGED = 1
"""The step whose driver runs a trainer stage after its requests."""
US_S = 1e-5
"""How close a recomputed union must be: each span edge is rounded to a µs."""

MakeConfig = Callable[..., aprof.ProfilerConfig]
Interval = tuple[int, int]
"""Wall clock, ns."""


class Batch:
    """``count`` concurrent requests through ``prof`` (the driver's profiler or a remote
    one), request ``i`` to replica ``i % replicas``, each held in flight until
    :meth:`finish`."""

    def __init__(self, prof: Any, tag: str, count: int, replicas: int) -> None:
        self.release = asyncio.Event()
        self._all_in = asyncio.Event()
        self._count = count
        self._admitted = 0
        self.done: asyncio.Future[list[tuple[str, int, int | None]]] = asyncio.gather(
            *(self._one(prof, f"{tag}-{i}", i % replicas) for i in range(count))
        )

    async def _one(self, prof: Any, request_id: str, replica: int) -> tuple[str, int, int | None]:
        async with prof.request(replica=replica, request_id=request_id) as req:
            self._admitted += 1
            if self._admitted == self._count:
                self._all_in.set()
            for _ in range(TURNS):
                await asyncio.sleep(0)
            await self.release.wait()
            for _ in range(TURNS):
                await asyncio.sleep(0)
        return request_id, replica, req.step

    async def in_flight(self) -> None:
        """Return once every request has gone ahead and is held (raise if one failed)."""
        all_in: asyncio.Future[Any] = asyncio.ensure_future(self._all_in.wait())
        done: asyncio.Future[Any] = self.done
        async with asyncio.timeout(LIMIT_S):
            await asyncio.wait([all_in, done], return_when=asyncio.FIRST_COMPLETED)
        all_in.cancel()
        if done.done():
            done.result()  # raises what a request raised
            raise AssertionError("the requests ended before they were released")

    async def finish(self) -> list[tuple[str, int, int | None]]:
        self.release.set()
        async with asyncio.timeout(LIMIT_S):
            return await self.done


class AccountingWorker:
    """An agent-loop worker process whose requests go through the driver's shared profiler."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int) -> None:
        self.rank = rank
        self.remote = aprof.ray.connect(handle, rank=rank)
        self.batch: Batch | None = None

    def name(self) -> str:
        return self.remote.name

    def current_step(self) -> int | None:
        return self.remote.current_step

    async def hold(self, step: int, count: int, replicas: int) -> None:
        """Begin ``count`` requests; return once all of them are in flight, held."""
        self.batch = Batch(self.remote, f"w{self.rank}-s{step}", count, replicas)
        await self.batch.in_flight()

    async def finish(self) -> list[tuple[str, int, int | None]]:
        assert self.batch is not None
        batch, self.batch = self.batch, None
        return await batch.finish()

    async def close(self) -> None:
        await self.remote.aclose()


Worker = ray.remote(AccountingWorker)


# -- the raw timelines --------------------------------------------------------------------------


@dataclass(frozen=True)
class RawRequest:
    process: str
    request_id: str
    replica: int
    step: int | None
    begin: int
    end: int


@dataclass
class Raw:
    """What the timeline files say, read here without aprof's report code."""

    steps: dict[int, Interval]
    requests: list[RawRequest]
    stages: list[Interval]


def _read_raw(save_path: Path, manifest: aprof.Manifest) -> Raw:
    steps: dict[int, Interval] = {}
    requests: list[RawRequest] = []
    stages: list[Interval] = []
    begun: dict[str, dict[str, tuple[int, dict[str, Any]]]] = defaultdict(dict)
    for entry in manifest.timeline:  # a process's parts in order: a span may end in the next
        data = json.loads(gzip.decompress((save_path / entry.path).read_bytes()))
        base = data["baseTimeNanoseconds"]
        mine = begun[entry.process]
        for event in data["traceEvents"]:
            cat, phase = event.get("cat"), event.get("ph")
            if cat == "step" and phase == "X":
                begin = base + event["ts"] * 1000
                steps[event["args"]["step"]] = (begin, begin + event["dur"] * 1000)
            elif cat in ("request", "span") and phase in ("b", "e"):
                key = f"{cat}:{event['id2']['local']}"
                when = base + event["ts"] * 1000
                if phase == "b":
                    mine[key] = (when, event.get("args", {}))
                    continue
                begin, args = mine.pop(key)
                if cat == "request":
                    requests.append(
                        RawRequest(
                            entry.process,
                            args["request_id"],
                            args["replica"],
                            args["step"],
                            begin,
                            when,
                        )
                    )
                elif args.get("aprof") == "stage":
                    stages.append((begin, when))
    assert not any(begun.values()), "a span began and never ended"
    return Raw(steps, requests, stages)


def _union(intervals: Iterable[Interval], within: Interval) -> list[Interval]:
    """The union of ``intervals`` clipped to ``within``, as sorted disjoint intervals."""
    low, high = within
    clipped = sorted((max(b, low), min(e, high)) for b, e in intervals)
    merged: list[list[int]] = []
    for begin, end in clipped:
        if end <= begin:
            continue
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return [(b, e) for b, e in merged]


def _length_s(union: list[Interval]) -> float:
    return sum(e - b for b, e in union) * 1e-9


def _both(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Where two sorted disjoint unions both cover (by brute force: they are short)."""
    return [(max(b1, b2), min(e1, e2)) for b1, e1 in a for b2, e2 in b if max(b1, b2) < min(e1, e2)]


# -- the test -----------------------------------------------------------------------------------


async def test_each_step_is_accounted_as_unions_over_every_process_timeline(
    make_config: MakeConfig,
) -> None:
    cfg = make_config(
        global_profiler={"steps": [1]},
        rollout={"replicas": "all", "forward_steps": None},
        timeouts={"connect_s": 30},  # a bound: actors just started may take a while to answer
    )
    sent: dict[int, list[tuple[str, int, int | None]]] = {}
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        workers = [Worker.remote(aprof.ray.share(prof), rank) for rank in range(2)]
        for n in STEPS:
            async with prof.step(n):
                assert await asyncio.gather(*(w.current_step.remote() for w in workers)) == [n] * 2
                await asyncio.gather(*(w.hold.remote(n, COUNT, REPLICAS) for w in workers))
                mine = Batch(prof, f"driver-s{n}", COUNT, REPLICAS)
                await mine.in_flight()
                # Every process's requests are in flight together now: release them all.
                batches = await asyncio.gather(mine.finish(), *(w.finish.remote() for w in workers))
                sent[n] = [s for batch in batches for s in batch]
                if n == STAGED:
                    with prof.stage("update"):
                        await asyncio.gather(*(w.name.remote() for w in workers))  # a round trip
        await asyncio.gather(*(w.close.remote() for w in workers))
        names = await asyncio.gather(*(w.name.remote() for w in workers))

    report = collect(prof.save_path)
    assert not report.problems
    raw = _read_raw(prof.save_path, aprof.load_manifest(prof.save_path))
    accounts = {a.step: a for a in report.accounts}
    assert sorted(accounts) == sorted(raw.steps) == list(STEPS)
    processes = {r.process for r in raw.requests}
    assert set(names) < processes and len(processes) == 3  # the driver's and both workers'
    assert Counter(r.process for r in raw.requests) == {p: COUNT * len(STEPS) for p in processes}

    for n in STEPS:
        account, span = accounts[n], raw.steps[n]
        assert {(s[2], s[1]) for s in sent[n]} == {(n, r) for r in range(REPLICAS)}
        admitted = [r for r in raw.requests if r.step == n]
        assert sorted(r.request_id for r in admitted) == sorted(s[0] for s in sent[n])
        # All were in flight together: each began before any ended, in every process.
        assert max(r.begin for r in admitted) <= min(r.end for r in admitted)
        assert len({r.process for r in admitted}) == 3

        rollout = _union(((r.begin, r.end) for r in raw.requests), span)
        assert account.rollout_s == pytest.approx(_length_s(rollout), abs=US_S)
        latencies = sum(r.end - r.begin for r in admitted) * 1e-9
        assert latencies > account.rollout_s > 0  # a sum would count them over and over
        assert account.requests == len(admitted) == 3 * COUNT

        busy = {a.replica: a for a in account.replicas}
        assert sorted(busy) == list(range(REPLICAS))
        for replica, mine_r in busy.items():
            spans = [(r.begin, r.end) for r in raw.requests if r.replica == replica]
            assert mine_r.busy_s == pytest.approx(_length_s(_union(spans, span)), abs=US_S)
            ours = [r for r in admitted if r.replica == replica]
            assert mine_r.requests == len(ours) == 3 * COUNT // REPLICAS
            assert sum(r.end - r.begin for r in ours) * 1e-9 > mine_r.busy_s > 0

        train = _union(raw.stages, span)
        assert account.train_s == pytest.approx(_length_s(train), abs=US_S)
        assert account.overlap_s == pytest.approx(_length_s(_both(rollout, train)), abs=US_S)
        assert (account.train_s > 0) is (n == STAGED)
        phases = account.rollout_s + account.train_s - account.overlap_s + account.idle_s
        assert phases == pytest.approx(account.wall_s, abs=1e-3)
        assert account.idle_s >= 0

        # Live: the driver merged every process's ledger (its own writes, the workers'
        # reports up to their last one at their close): the same step, exact to the ns.
        live = prof.accounting(n)
        assert live is not None
        assert live.requests == account.requests
        assert {r.replica: r.requests for r in live.replicas} == {
            r.replica: r.requests for r in account.replicas
        }
        for field in ("wall_s", "rollout_s", "train_s", "overlap_s", "idle_s"):
            assert getattr(live, field) == pytest.approx(getattr(account, field), abs=4 * US_S)
