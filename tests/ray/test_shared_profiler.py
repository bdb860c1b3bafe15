"""One driver's profiler shared with agent-loop worker processes, on a real local Ray cluster.

The driver's targets are aprof.testing.RecordingTargets (slow starts, held stops) or real
reference servers in their own processes; the workers are Ray async actors that send
concurrent requests through ``aprof.ray.connect``'s remote profiler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gzip
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

import aprof
import aprof.ray
from aprof._timeline.recorder import span_id_of
from aprof.ray._hub import Hub
from aprof.ray._remote import UNGATED
from aprof.ray._share import _DriverLink
from aprof.testing import RecordingTarget, assert_windows

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")

pytestmark = pytest.mark.usefixtures("ray_cluster")

LIMIT_S = 120
MakeConfig = Callable[..., aprof.ProfilerConfig]


@dataclass(frozen=True)
class Sent:
    """One request as its worker saw it."""

    worker: int
    replica: int
    step: int | None
    gated: bool
    captured: bool
    entered_ns: int
    """Wall clock before ``async with`` began."""
    admitted_ns: int
    """Wall clock once it went ahead."""
    traceparent: str | None
    """Its W3C trace context, read inside the request."""


class LoopWorker:
    """An agent-loop worker process: requests through the driver's shared profiler."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int) -> None:
        self.rank = rank
        self.remote = aprof.ray.connect(handle, rank=rank)
        self.release = asyncio.Event()
        self.held: list[asyncio.Task[Sent]] = []

    def name(self) -> str:
        return self.remote.name

    def current_step(self) -> int | None:
        return self.remote.current_step

    async def send(self, count: int, replicas: int) -> list[Sent]:
        """``count`` concurrent requests, request ``i`` to replica ``i % replicas``."""
        return list(await asyncio.gather(*(self._one(i % replicas) for i in range(count))))

    def hold(self, count: int, replicas: int) -> None:
        """Begin ``count`` requests that stay in flight until :meth:`finish`."""
        for i in range(count):
            self.held.append(asyncio.create_task(self._one(i % replicas, self.release)))

    def cancel_first(self) -> None:
        """Cancel the first held request (it waits for its window's start)."""
        self.held.pop(0).cancel()

    async def finish(self) -> list[Sent]:
        self.release.set()
        held, self.held = self.held, []
        return list(await asyncio.gather(*held))

    async def close(self) -> None:
        await self.remote.aclose()

    async def _one(self, replica: int, until: asyncio.Event | None = None) -> Sent:
        entered = time.time_ns()
        async with self.remote.request(replica=replica, request_id=f"w{self.rank}") as req:
            admitted = time.time_ns()
            traceparent = req.traceparent
            await (until.wait() if until is not None else asyncio.sleep(0))
        return Sent(
            self.rank, replica, req.step, req.gated, req.captured, entered, admitted, traceparent
        )


Worker = ray.remote(LoopWorker)


class BlockableWorker(LoopWorker):
    """A worker whose event loop the test can block (a synchronous call) and release: its
    control calls run in a concurrency group of their own, with its own thread and loop."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int) -> None:
        super().__init__(handle, rank)
        self.blocked = threading.Event()
        self.unblocked = threading.Event()

    async def block(self) -> None:
        """Hold this worker's event loop, where its remote profiler runs, until released."""
        self.blocked.set()
        self.unblocked.wait(LIMIT_S)

    @ray.method(concurrency_group="control")
    async def wait_blocked(self) -> bool:
        return await asyncio.to_thread(self.blocked.wait, LIMIT_S)

    @ray.method(concurrency_group="control")
    async def unblock(self) -> None:
        self.unblocked.set()


Blockable = ray.remote(concurrency_groups={"control": 2})(BlockableWorker)


class CatchingWorker(BlockableWorker):
    """A worker that holds its event loop until Ray has delivered some news from the hub and
    then, before the loop has run what came with it, enters one more request: as a wave of
    requests in a busy loop would (private attributes read only to know the news is here)."""

    async def enter_once_answered(self, replica: int) -> tuple[bool, bool, bool]:
        """Once the answer to this process's ask (a held request's) is here."""
        self.blocked.set()
        concurrent.futures.wait(list(self.remote._answers.values()), timeout=LIMIT_S)
        return await _enter_at_once(self.remote.request(replica=replica))

    async def enter_once_heard(self, replica: int) -> tuple[tuple[bool, bool, bool], int]:
        """Once the view the watch in flight returns is here; also how many versions that
        view is ahead of the one held before."""
        self.blocked.set()
        heard, held = self.remote._heard, self.remote._view.version
        assert heard is not None
        concurrent.futures.wait([heard], timeout=LIMIT_S)
        entered = await _enter_at_once(self.remote.request(replica=replica))
        return entered, self.remote._view.version - held


Catching = ray.remote(concurrency_groups={"control": 2})(CatchingWorker)


async def _enter_at_once(req: Any) -> tuple[bool, bool, bool]:
    """Enter ``req`` without letting the event loop run: whether it went ahead at once (it
    waited for nothing), gated, captured; then end it."""
    entering = req.__aenter__().__await__()
    try:
        next(entering)
    except StopIteration:
        await req.__aexit__(None, None, None)
        return True, req.gated, req.captured
    return False, req.gated, req.captured  # it waits for an answer: the test fails on this


def _workers(handle: aprof.ray.ShareHandle, n: int) -> list[Any]:
    return [Worker.remote(handle, rank) for rank in range(n)]  # type: ignore[attr-defined]


async def _joined(workers: list[Any]) -> None:
    """Once each worker's ``connect`` has returned (the hub is up and knows it): a step the
    driver enters then waits until the worker has it. Before that, a hub slow to start (a
    busy node) lets the step begin first, and the worker's requests go outside it."""
    await asyncio.gather(*(w.name.remote() for w in workers))


async def _send(workers: list[Any], count: int, replicas: int) -> list[Sent]:
    batches = await asyncio.gather(*(w.send.remote(count, replicas) for w in workers))
    return [sent for batch in batches for sent in batch]


def _per_window(sent: list[Sent]) -> Counter[tuple[int | None, int]]:
    return Counter((s.step, s.replica) for s in sent)


async def test_four_processes_start_and_stop_each_window_once_and_sum_their_counts(
    make_config: MakeConfig,
) -> None:
    stops = asyncio.Event()
    targets = [
        RecordingTarget(f"replica_{r}", replica=r, start_latency=0.2, stop_gate=stops)
        for r in (0, 1)
    ]
    cfg = make_config(
        global_profiler={"steps": [1, 3, 4]},
        rollout={"replicas": "all", "forward_steps": None},
        timeouts={"connect_s": 30},  # a bound: actors just started may take a while to answer
    )
    sent: dict[int, list[Sent]] = {}
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        for target in targets:
            prof.add_target(target)
        workers = _workers(aprof.ray.share(prof), 4)
        for n in (1, 2, 3):
            async with prof.step(n):
                assert await asyncio.gather(*(w.current_step.remote() for w in workers)) == [n] * 4
                # Step 2 runs while step 1's stops are held; step 3's windows queue behind
                # them, and are skipped as they are still queued when the step ends.
                sent[n] = await _send(workers, 250, 2)
        stops.set()
        async with prof.step(4):
            sent[4] = await _send(workers, 250, 2)
        await asyncio.gather(*(w.close.remote() for w in workers))
        names = await asyncio.gather(*(w.name.remote() for w in workers))

    for target in targets:
        for op in ("start", "stop"):
            assert [c.window.step for c in target.calls if c.op == op] == [1, 4]
    windows = {(w.step, w.target): w for w in prof.manifest.windows}
    for n in (1, 4):
        for (step, replica), count in _per_window(sent[n]).items():
            record = windows[(step, f"replica_{replica}")]
            assert record.state == "done"
            assert record.requests.admitted == count == 500
            gated = [s for s in sent[n] if s.replica == replica and s.gated]
            assert record.requests.gated == len(gated)
            assert all(s.captured for s in sent[n] if s.replica == replica)
            assert record.started_ns is not None
            # Gated requests were held until their window had started; none waited after.
            assert all(s.admitted_ns >= record.started_ns for s in gated)
            ungated = [s for s in sent[n] if s.replica == replica and not s.gated]
            assert all(s.admitted_ns >= record.started_ns for s in ungated)
    assert sum(s.gated for s in sent[1]) > 0  # the start took a while: some waited for it
    for n in (2, 3):  # step 2: not profiled; step 3: its windows waited for the held stops
        assert {(s.step, s.gated, s.captured) for s in sent[n]} == {(n, False, False)}
    assert_windows(  # no request was counted into them while they waited
        prof.manifest,
        [{"step": 3, "target": f"replica_{r}", "state": "skipped", "requests.admitted": 0}
         for r in (0, 1)],
        exact=False,
    )  # fmt: skip
    listed = {t.process: t for t in prof.manifest.timeline}
    assert set(names) == {f"agent_loop_worker_{k}" for k in range(4)} <= set(listed)
    for name in names:
        entry = listed[name]
        assert entry.path == f"timeline/{name}.trace.json.gz"
        assert entry.events == 1000 and entry.dropped == 0
        assert (prof.save_path / entry.path).stat().st_size == entry.bytes
    assert not prof.manifest.notes


async def test_a_request_cancelled_while_it_waits_leaves_the_others_waiting(
    make_config: MakeConfig,
) -> None:
    starts = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, start_gate=starts)
    cfg = make_config(rollout={"forward_steps": None}, timeouts={"start_s": 60, "connect_s": 30})
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        [worker] = _workers(aprof.ray.share(prof), 1)
        async with prof.step(1):
            await worker.hold.remote(5, 1)
            await target.wait_calls("start")  # all five wait for it
            await worker.cancel_first.remote()
            starts.set()
            held = await worker.finish.remote()
        await worker.close.remote()
    assert [(s.gated, s.captured) for s in held] == [(True, True)] * 4
    assert_windows(
        prof.manifest, [{"step": 1, "state": "done", "requests.admitted": 4, "requests.gated": 4}]
    )
    trace = prof.save_path / "timeline" / "agent_loop_worker_0.trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    begun = [e for e in events if e.get("cat") == "request" and e["ph"] == "b"]
    notes = Counter(e["args"].get("note") for e in begun)
    assert notes == Counter({None: 4, "CancelledError": 1})


async def test_a_request_keeps_the_step_its_process_admitted_it_in(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(
        global_profiler={"steps": [1]}, rollout={"forward_steps": None}, timeouts={"connect_s": 30}
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        [worker] = _workers(aprof.ray.share(prof), 1)
        async with prof.step(1):
            await worker.hold.remote(8, 1)
            [warm] = await worker.send.remote(1, 1)  # after the held ones: they went first
        async with prof.step(2):
            late = await worker.send.remote(8, 1)
            early = await worker.finish.remote()
        await worker.close.remote()
    assert (warm.step, warm.captured) == (1, True)
    assert {(s.step, s.captured) for s in early} == {(1, True)}
    assert {(s.step, s.captured) for s in late} == {(2, False)}
    # Their trace context is the run's: one trace per step, as the driver's own requests'.
    salt, span = prof.manifest.trace_salt, span_id_of("w0")
    assert {s.traceparent for s in [warm, *early]} == {f"00-{salt}{1:016x}-{span}-01"}
    assert {s.traceparent for s in late} == {f"00-{salt}{2:016x}-{span}-01"}
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "requests.admitted": 9}])


async def test_the_fast_path_needs_neither_the_driver_nor_a_round_trip(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(
        global_profiler={"steps": [1]}, rollout={"forward_steps": None}, timeouts={"connect_s": 30}
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        [worker] = _workers(aprof.ray.share(prof), 1)
        async with prof.step(1):
            await worker.send.remote(1, 1)  # the one round trip: the window starts
            # The driver's event loop is blocked inside this call: requests that needed it
            # would never be answered, and the blocking wait would time out.
            fast = ray.get(worker.send.remote(200, 1), timeout=60)
        await worker.close.remote()
    assert {(s.step, s.gated, s.captured) for s in fast} == {(1, False, True)}
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "requests.admitted": 201}])


async def test_a_request_takes_the_answer_ray_delivered_before_the_loop_ran_it(
    make_config: MakeConfig,
) -> None:
    """The rest of a wave goes ahead once the ask's answer is in the process, not when the
    busy event loop gets to it: gated are those that came while the window started."""
    starts = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, start_gate=starts)
    cfg = make_config(
        global_profiler={"steps": [1]}, rollout={"forward_steps": None}, timeouts={"connect_s": 30}
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        worker = Catching.remote(aprof.ray.share(prof), 0)
        await _joined([worker])
        async with prof.step(1):
            await worker.hold.remote(1, 1)  # asks; the window starts, held
            await target.wait_calls("start")
            entered = worker.enter_once_answered.remote(0)
            assert await worker.wait_blocked.remote()
            starts.set()
            went, gated, captured = await entered
            [held] = await worker.finish.remote()
        await worker.close.remote()
    assert (went, gated, captured) == (True, False, True)
    assert (held.gated, held.captured) == (True, True)
    assert_windows(
        prof.manifest, [{"step": 1, "state": "done", "requests.admitted": 2, "requests.gated": 1}]
    )


async def test_a_request_takes_the_view_ray_delivered_before_the_loop_ran_it(
    make_config: MakeConfig,
) -> None:
    """A process whose loop is busy as another opens a window learns it from the view Ray
    has delivered: its first request to it asks nobody. The window opened and started in
    one turn of the driver's loop: one view says so, not one for each move."""
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(
        global_profiler={"steps": [1]}, rollout={"forward_steps": None}, timeouts={"connect_s": 30}
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        worker = Catching.remote(aprof.ray.share(prof), 0)
        await _joined([worker])
        async with prof.step(1):
            entered = worker.enter_once_heard.remote(0)  # its view: replica 0's window due
            assert await worker.wait_blocked.remote()
            async with prof.request(replica=0) as own:  # opens and starts the window
                assert own.captured
            (went, gated, captured), ahead = await entered
        await worker.close.remote()
    assert (went, gated, captured, ahead) == (True, False, True, 1)
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "requests.admitted": 2}])


def test_a_synchronous_driver_shares_a_blocking_profiler(make_config: MakeConfig) -> None:
    target = RecordingTarget("replica_0", replica=0, start_latency=0.1)
    cfg = make_config(
        global_profiler={"steps": [2]}, rollout={"forward_steps": None}, timeouts={"connect_s": 30}
    )
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(target)
        workers = _workers(aprof.ray.share(prof), 2)
        sent = {}
        for n in (1, 2):
            with prof.step(n):
                sent[n] = [s for w in workers for s in ray.get(w.send.remote(50, 1), timeout=60)]
        ray.get([w.close.remote() for w in workers], timeout=60)
    assert {(s.step, s.captured) for s in sent[1]} == {(1, False)}
    assert {(s.step, s.captured) for s in sent[2]} == {(2, True)}
    assert_windows(prof.manifest, [{"step": 2, "state": "done", "requests.admitted": 100}])


async def test_a_worker_killed_mid_step_costs_its_own_counts_only(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(
        global_profiler={"steps": [1, 2]},
        rollout={"forward_steps": None},
        timeouts={"connect_s": 5},
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        workers = _workers(aprof.ray.share(prof), 3)
        await _joined(workers)
        async with prof.step(1):
            first = await _send(workers, 20, 1)
            await asyncio.gather(*(w.hold.remote(10, 1) for w in workers))
            ray.kill(workers[1])
            held = [s for w in (workers[0], workers[2]) for s in await w.finish.remote()]
        async with prof.step(2):  # waits for the dead worker at most timeouts.connect_s
            second = await _send([workers[0], workers[2]], 20, 1)
        await asyncio.gather(workers[0].close.remote(), workers[2].close.remote())

    manifest = aprof.load_manifest(prof.save_path)
    by_step = {w.step: w for w in manifest.windows}
    assert {w.state for w in manifest.windows} == {"done"}
    survivors = [s for s in first + held if s.worker != 1]
    # The dead worker's 30 requests count as far as it reported them before it died.
    assert len(survivors) == 60 <= by_step[1].requests.admitted <= 60 + 30
    assert by_step[2].requests.admitted == len(second) == 40
    notes = " | ".join(n.text for n in manifest.notes)
    assert "agent_loop_worker_1 did not take step 2" in notes
    assert "agent_loop_worker_1 did not close its remote profiler" in notes


def _requests(trace: Any) -> list[dict[str, Any]]:
    """The request events of a worker's timeline file."""
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return [e for e in events if e.get("cat") == "request" and e["ph"] == "b"]


async def test_workers_that_never_close_are_closed_by_the_driver(make_config: MakeConfig) -> None:
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(
        global_profiler={"steps": [1, 2]},
        rollout={"forward_steps": None},
        timeouts={"connect_s": 30},
    )
    async with asyncio.timeout(LIMIT_S):
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(target)
            workers = _workers(aprof.ray.share(prof), 3)
            sent = {}
            for n in (1, 2):
                async with prof.step(n):
                    sent[n] = await _send(workers, 100, 1)
            names = await asyncio.gather(*(w.name.remote() for w in workers))
            # No worker closes its remote profiler: the driver's close has them close.
        # Closed that way, a remote profiler lets requests go, ungated and uncounted.
        after = await _send(workers, 5, 1)
        assert all(not (s.gated or s.captured) for s in after)
        await asyncio.gather(*(w.close.remote() for w in workers))  # closed already: no-op

    manifest = aprof.load_manifest(prof.save_path)
    assert not manifest.notes
    assert [len(sent[n]) for n in (1, 2)] == [300, 300]
    assert_windows(
        manifest, [{"step": n, "state": "done", "requests.admitted": 300} for n in (1, 2)]
    )
    listed = {t.process: t for t in manifest.timeline}
    for name in names:
        entry = listed[name]
        assert (entry.events, entry.dropped) == (200, 0)
        trace = prof.save_path / entry.path
        assert trace.stat().st_size == entry.bytes
        assert len(_requests(trace)) == 200


async def test_a_worker_busy_as_the_driver_closes_is_noted_and_closes_later(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    connect_s = 5
    cfg = make_config(
        global_profiler={"steps": [1]},
        rollout={"forward_steps": None},
        timeouts={"connect_s": connect_s},
    )
    async with asyncio.timeout(LIMIT_S):
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(target)
            handle = aprof.ray.share(prof)
            free, busy = (Blockable.remote(handle, rank) for rank in range(2))
            await _joined([free, busy])
            async with prof.step(1):
                sent = await _send([free, busy], 20, 1)
            blocked = busy.block.remote()
            assert await busy.wait_blocked.remote()
            closing = time.monotonic()
        closed_s = time.monotonic() - closing
        await busy.unblock.remote()
        await blocked
        # Its loop free again, it closes (the hub is gone): nothing raises into its calls.
        after = await busy.send.remote(5, 1)
        await busy.close.remote()
    assert connect_s <= closed_s < connect_s + 10  # waited for the busy worker, and no more
    assert all(not (s.gated or s.captured) for s in after)
    manifest = aprof.load_manifest(prof.save_path)
    [window] = manifest.windows
    # The busy worker's counts are in as far as it reported them before its loop stopped.
    assert 20 <= window.requests.admitted <= len(sent) == 40
    notes = [n.text for n in manifest.notes]
    assert len(notes) == 1 and "agent_loop_worker_1 did not close its remote profiler" in notes[0]
    entry = {t.process: t for t in manifest.timeline}["agent_loop_worker_0"]
    assert entry.events == 20 and len(_requests(prof.save_path / entry.path)) == 20


async def test_a_hub_killed_mid_step_lets_requests_go_ungated(make_config: MakeConfig) -> None:
    starts = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, start_gate=starts)
    cfg = make_config(
        global_profiler={"steps": [1, 2]},
        rollout={"forward_steps": None},
        timeouts={"connect_s": 30, "start_s": 60},  # bounds: nothing waits for them here
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        handle = aprof.ray.share(prof)
        [worker] = _workers(handle, 1)
        await _joined([worker])
        async with prof.step(1):
            await worker.hold.remote(5, 1)  # they wait for the start, which is held
            await target.wait_calls("start", limit_s=LIMIT_S)  # a busy node is slow, not stuck
            ray.kill(handle.hub)
            # Released without the start: the asks in flight failed with the hub.
            held = await worker.finish.remote()
            after = await worker.send.remote(5, 1)
            starts.set()
        async with prof.step(2):
            pass
        await worker.close.remote()
    for sent in held + after:
        assert (sent.step, sent.gated, sent.captured) == (1, False, False)
    manifest = aprof.load_manifest(prof.save_path)
    assert [(w.step, w.state) for w in manifest.windows] == [(1, "done"), (2, "skipped")]
    assert any("hub shared with other processes is gone" in n.text for n in manifest.notes)
    # The worker's own timeline says when and why its requests went ungated.
    trace = prof.save_path / "timeline" / "agent_loop_worker_0.trace.json.gz"
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    [mark] = [e for e in events if e.get("name") == UNGATED and e.get("ph") == "b"]
    assert mark["args"]["replica"] == 0 and mark["args"]["note"].startswith("hub gone")


class _StartingHub:
    """A hub actor's handle, as Ray's: ``hub.<call>.remote(...)`` sends the call at once and
    returns what awaits its answer, which comes whether or not the caller still waits. Over
    a :class:`Hub` in this process, whose first ``held`` pulls reach it only once the test
    sets their event, as calls to a hub actor still starting."""

    def __init__(self, hub: Hub, held: int) -> None:
        self.hub = hub
        self.held = held
        self.pulls: asyncio.Queue[tuple[asyncio.Event, asyncio.Future[Any]]] = asyncio.Queue()
        """Each held pull, as it is sent: its event and its answer."""

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.hub, name)

        async def answer(*args: Any) -> Any:
            result = call(*args)
            return await result if asyncio.iscoroutine(result) else result

        def remote(*args: Any) -> asyncio.Future[Any]:
            if name != "pull" or self.held == 0:
                sent = asyncio.ensure_future(answer(*args))
            else:
                self.held -= 1
                arrived = asyncio.Event()

                async def held() -> Any:
                    await arrived.wait()
                    return await answer(*args)

                sent = asyncio.ensure_future(held())
                self.pulls.put_nowait((arrived, sent))
            return asyncio.shield(sent)  # a caller that stops waiting does not stop the call

        return SimpleNamespace(remote=remote)


async def test_an_ask_taken_by_a_pull_the_driver_gave_up_on_still_opens_its_window(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a hub that starts late does (a busy node): Ray runs the driver's first pull after
    # the driver gave up on it, and the first ask goes with it to nobody.
    monkeypatch.setattr(aprof.ray._share, "PULL_S", 0.5)  # the driver gives up after 1.5 s
    target = RecordingTarget("replica_0", replica=0)
    cfg = make_config(rollout={"forward_steps": None}, timeouts={"connect_s": 1, "start_s": 60})
    hub = Hub(start_s=60, connect_s=1)
    starting = _StartingHub(hub, held=2)
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        handle = aprof.ray.ShareHandle(starting, {}, str(prof.save_path), prof.run_id)
        _DriverLink.started(prof._serving, handle)
        async with prof.step(1):
            first, given_up = await starting.pulls.get()
            second, pulled = await starting.pulls.get()  # sent as the driver gave up
            asking = asyncio.create_task(hub.ask(1, 0))  # a worker's first request
            first.set()
            [mail] = await given_up  # it reached the hub first: it took the ask
            assert mail.asks == [(1, 0)]
            second.set()  # the driver's pull, which took nothing yet, is handed it again
            await target.wait_calls("start", limit_s=LIMIT_S)
            assert (await asyncio.wait_for(asking, LIMIT_S))[0] == "started"
            assert await pulled == [mail]
    assert_windows(prof.manifest, [{"step": 1, "state": "done"}])


async def test_two_real_reference_servers_auto_stop_and_count_every_process(
    make_config: MakeConfig, tmp_path: Any
) -> None:
    from servers import launch, launch_spec
    from servers.process import free_port

    cfg = make_config(
        # Each step ends once its windows have: the next one's then start at once, not queued
        # behind a stop (requests go uncounted meanwhile, as in one process).
        global_profiler={"steps": [1, 2], "wait_for_stops": True},
        rollout={"replicas": "all", "forward_steps": 2},
        tool_config={"torch": {"contents": ["cpu"]}},
        timeouts={"start_s": 60, "stop_s": 120, "connect_s": 30},
    )
    specs = [
        launch_spec("reference", cfg, version="0.32.0", port=free_port(), dialect="vllm")
        for _ in range(2)
    ]
    async with asyncio.timeout(LIMIT_S * 2):
        servers = await asyncio.gather(
            *(launch(s, log_path=tmp_path / f"replica_{r}.log") for r, s in enumerate(specs))
        )
        try:
            async with aprof.Profiler(cfg) as prof:
                for r, spec in enumerate(specs):
                    prof.add_target(spec.adapter(replica=r))
                handle = aprof.ray.share(prof)
                workers = [
                    ReferenceWorker.remote(handle, k, [s.base_url for s in specs])  # type: ignore[attr-defined]
                    for k in range(4)
                ]
                # Each worker has joined and watches: the steps wait until it has them.
                await asyncio.gather(*(w.step.remote() for w in workers))
                sent: dict[int, list[Outcome]] = {}
                for n in (1, 2):
                    async with prof.step(n):
                        batches = await asyncio.gather(*(w.send.remote(250) for w in workers))
                        sent[n] = [c for batch in batches for c in batch]
                await asyncio.gather(*(w.close.remote() for w in workers))
        finally:
            await asyncio.gather(*(s.aclose() for s in servers))
    manifest = aprof.load_manifest(prof.save_path)
    assert len(manifest.windows) == 4
    for record in manifest.windows:
        replica = int(record.target.removeprefix("replica_"))
        # A request that came after the server's auto-stop (a worker slow to send, on a
        # loaded machine) goes uncaptured and uncounted; every captured one counts, once,
        # and so may an attempt that then failed over to the other replica (connect timeout).
        captured = [c for c in sent[record.step] if c[0] == replica and c[2]]
        left = [c for c in sent[record.step] if replica in c[3]]
        assert (record.state, record.stop_reason) == ("done", "auto_stop")
        assert record.forward_steps.enforced_by == "server"
        assert record.forward_steps.observed == record.forward_steps.requested == 2
        assert 0 < len(captured) <= record.requests.admitted <= len(captured) + len(left)
        assert 1 <= record.requests.gated <= record.requests.admitted
        assert record.files
    assert not [n.text for n in manifest.notes if n.level == "problem"]


Outcome = tuple[int, int | None, bool, tuple[int, ...]]


class _ReferenceWorker:
    """An agent-loop worker with an agentloop client over the real servers."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int, urls: list[str]) -> None:
        from agentloop import LLMClient

        self.remote = aprof.ray.connect(handle, rank=rank)
        self.llm = LLMClient(urls, prof=self.remote, timeout_s=60.0)

    async def send(self, count: int) -> list[Outcome]:
        """Each request's replica, step, whether it was captured, and the replicas it
        failed over from."""
        async with self.llm:
            outs = await asyncio.gather(
                *(self.llm.generate(f"prompt {i}", max_tokens=2) for i in range(count))
            )
        return [(o.replica, o.step, o.captured, o.failed_over_from) for o in outs]

    async def step(self) -> int | None:
        return self.remote.current_step

    async def close(self) -> None:
        await self.remote.aclose()


ReferenceWorker = ray.remote(_ReferenceWorker)
