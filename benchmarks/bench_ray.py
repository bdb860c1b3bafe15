"""What sharing a profiler with Ray processes costs: ``aprof.ray.share`` and ``connect``.

One driver (an open ``aprof.Profiler`` shared with ``aprof.ray.share``) and ``--actors`` Ray
async actors, each connected with ``aprof.ray.connect``; rollout targets are in-process
``RecordingTarget``s of the driver (replicas 0 and 1, ``start_latency=0``), every step is
profiled (``steps: {every: 1}``) and the timeline is on everywhere.

1. Per request: ``--calls`` sequential ``async with remote.request(replica=0): pass`` in one
   actor while the step's window of replica 0 is active and the actor has already made its
   first request of the step (the fast path: admitted locally), against the same loop of the
   driver's own ``prof.request(replica=0)`` in the driver's process (window active) and a bare
   ``async with`` of an empty async context manager in each process. One profiled step per
   round, the four variants interleaved in each, ``--rounds`` rounds; medians.
2. First request per (process, step, replica), over ``--first-steps`` profiled steps: the
   latency of a process's first request to a replica whose window is due (the round trip
   through the hub to the driver, which starts the window, and back), then, in the same step,
   of another process's first request to it once it is active (its view already says so: no
   round trip), and a bare round trip to the hub (``ask`` with the window active): what a
   first request pays when its view still says due or starting. The processes take turns.
3. ``--actors`` actors x ``--loops`` concurrent coroutines, each one request to replica
   ``i % 2`` around a ``--reply-s`` reply (``asyncio.sleep``), for ``--steps`` steps: wall time
   per step with profiling on (profiled steps, windows captured) against off (the same
   coroutines with the reply alone: no request context, no step), variants interleaved,
   ``--scale-rounds`` rounds; medians. Two passes, each with its own profiler, hub and actors:
   ``rollout.start: on_first_request`` (the profiler of parts 1 and 2: each process's first
   request to a replica asks the hub, and the first of all starts the window through the
   driver), then ``rollout.start: on_step`` (a second profiler, opened once the first is
   closed: the windows are started and every actor's view says so before the step's body
   runs, so no request asks). Also the time ``prof.step(n)`` takes to enter in the "on"
   variant (the step's handshake with every actor, plus the windows' start with ``on_step``).

The C timeline recorder by default (``--recorder``, as in ``backends.py``; the actors get the
same recorder through Ray's ``runtime_env``). Ray runs locally (``RAY_AUTH_MODE=disabled``).

Run with ``nox -s bench`` (or ``python benchmarks/bench_ray.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import backends
import ray

import aprof
import aprof.ray
from aprof.testing import RecordingTarget

REPLICAS = 2


class Empty:
    """The cheapest possible async context manager."""

    async def __aenter__(self) -> Empty:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


async def bare_loop(calls: int) -> float:
    """ns per ``async with Empty()``."""
    began = time.perf_counter_ns()
    for _ in range(calls):
        async with Empty():
            pass
    return (time.perf_counter_ns() - began) / calls


async def request_loop(prof: aprof.Profiler | aprof.ray.RemoteProfiler, calls: int) -> float:
    """ns per ``async with prof.request(replica=0)``."""
    began = time.perf_counter_ns()
    for _ in range(calls):
        async with prof.request(replica=0):
            pass
    return (time.perf_counter_ns() - began) / calls


@ray.remote
class Worker:
    """An agent-loop process: a Ray async actor with a remote profiler."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int) -> None:
        self.remote = aprof.ray.connect(handle, role="agent_loop_worker", rank=rank)
        self.hub = handle.hub

    def backend(self) -> str:
        return aprof.timeline_backend()

    async def current_step(self) -> int | None:
        return self.remote.current_step

    async def first(self, replica: int) -> tuple[int, str | None, bool, bool]:
        """ns until this process's request to ``replica`` is admitted; the phase this process
        saw before it (private, only to say which path it took); captured; gated."""
        phase = self.remote._view.phases.get(replica)
        began = time.perf_counter_ns()
        async with self.remote.request(replica=replica) as req:
            took = time.perf_counter_ns() - began
        return took, phase, req.captured, req.gated

    async def hub_round_trip(self, step: int, replica: int) -> int:
        """ns of one ``ask`` to the hub for a window it knows is active."""
        began = time.perf_counter_ns()
        answer = await self.hub.ask.remote(step, replica)
        took = time.perf_counter_ns() - began
        if isinstance(answer, tuple):  # newer hubs answer with the view's version too
            answer = answer[0]
        assert answer == "active", answer
        return took

    async def loop(self, variant: str, calls: int) -> float:
        """ns per call of ``calls`` sequential ``bare`` or ``request`` contexts."""
        if variant == "bare":
            return await bare_loop(calls)
        return await request_loop(self.remote, calls)

    async def agent_loops(self, loops: int, reply_s: float, profiled: bool) -> None:
        remote = self.remote

        async def one(i: int) -> None:
            if profiled:
                async with remote.request(replica=i % REPLICAS):
                    await asyncio.sleep(reply_s)
            else:
                await asyncio.sleep(reply_s)

        await asyncio.gather(*(one(i) for i in range(loops)))

    async def settle(self) -> None:
        """Write this process's timeline and wait for it (private: RemoteProfiler has no
        flush; only so that one variant's writing does not run into the next)."""
        await self.remote._timeline.write_now()

    async def close(self) -> None:
        await self.remote.aclose()


def config(save: str, buffer: int, start: str = "on_first_request") -> dict[str, Any]:
    return {
        "global_profiler": {"steps": {"every": 1}, "save_path": save},
        "rollout": {"replicas": "all", "forward_steps": None, "start": start},
        "timeline": {"buffer_events": buffer},
        "log": {"level": "warning"},
    }


CALL_VARIANTS = (
    "bare `async with`, driver",
    "`prof.request`, active window, driver",
    "bare `async with`, actor",
    "`remote.request`, active window (fast path), actor",
)


async def measure_calls(
    prof: aprof.Profiler, workers: list[Any], steps: Callable[[], int], calls: int, rounds: int
) -> dict[str, list[float]]:
    worker = workers[0]
    seen: dict[str, list[float]] = {name: [] for name in CALL_VARIANTS}
    runs: dict[str, Callable[[], Awaitable[float]]] = {
        CALL_VARIANTS[0]: lambda: bare_loop(calls),
        CALL_VARIANTS[1]: lambda: request_loop(prof, calls),
        CALL_VARIANTS[2]: lambda: worker.loop.remote("bare", calls),
        CALL_VARIANTS[3]: lambda: worker.loop.remote("request", calls),
    }
    for i in range(rounds):
        async with prof.step(steps()) as n:
            async with prof.request(replica=0) as first:  # opens and starts the window
                assert first.captured
            _, _, captured, _ = await worker.first.remote(0)  # the actor's first: warm
            assert captured
            order = list(CALL_VARIANTS)
            if i % 2:  # alternate which process goes first
                order = order[2:] + order[:2]
            for name in order:
                seen[name].append(await runs[name]())
                # Not timed: both timelines written, their writers idle again.
                await asyncio.gather(prof.flush(), worker.settle.remote())
            assert prof.current_step == n
    return seen


FIRST_VARIANTS = (
    "driver's own, window due: in-process start (replica 1)",
    "window due: round trip through the hub and the driver, start",
    "window active, this process's view behind: one round trip to the hub",
    "window active, view here: admitted locally",
    "a bare round trip to the hub (`ask`, window active)",
)


async def measure_first(
    prof: aprof.Profiler, workers: list[Any], steps: Callable[[], int], count: int
) -> dict[str, list[float]]:
    """µs per first request; the active-window ones sorted by the phase the process saw."""
    seen: dict[str, list[float]] = {name: [] for name in FIRST_VARIANTS}
    for i in range(count):
        due, *others = (workers[(i + k) % len(workers)] for k in range(3))
        async with prof.step(steps()) as n:
            took, phase, captured, gated = await due.first.remote(0)
            assert phase == "due" and captured and gated, (phase, captured, gated)
            seen[FIRST_VARIANTS[1]].append(took / 1e3)
            # One process right after (as the driver's next call: its view may lag), one
            # after a pause (its view has caught up).
            for k, other in enumerate(others):
                await asyncio.sleep(0.02 * k)
                took, phase, captured, gated = await other.first.remote(0)
                assert captured and not gated, (captured, gated)
                seen[FIRST_VARIANTS[3 if phase == "active" else 2]].append(took / 1e3)
            seen[FIRST_VARIANTS[4]].append(await others[0].hub_round_trip.remote(n, 0) / 1e3)
            await asyncio.sleep(0.02)  # the hub and the processes idle again
            began = time.perf_counter_ns()
            async with prof.request(replica=1) as own:
                seen[FIRST_VARIANTS[0]].append((time.perf_counter_ns() - began) / 1e3)
            # Started inside the request (eager): a start that needs no wait gates nothing.
            assert own.captured and not own.gated
    return seen


SCALE_VARIANTS = ("profiling off", "profiling on")
SCALE_PASSES = ("on_first_request", "on_step")


async def measure_scale(
    prof: aprof.Profiler,
    workers: list[Any],
    steps: Callable[[], int],
    loops: int,
    reply_s: float,
    per_round: int,
    rounds: int,
) -> dict[str, Any]:
    """Wall s per step per variant, ms of each profiled step's entry, the profiled steps."""
    seen: dict[str, list[float]] = {name: [] for name in SCALE_VARIANTS}
    entry_ms: list[float] = []
    profiled_steps = []
    for i in range(rounds):
        order = SCALE_VARIANTS[i % 2 :] + SCALE_VARIANTS[: i % 2]
        for name in order:
            on = name != SCALE_VARIANTS[0]
            for _ in range(per_round):
                began = time.perf_counter()
                if not on:
                    await asyncio.gather(
                        *(w.agent_loops.remote(loops, reply_s, on) for w in workers)
                    )
                    seen[name].append(time.perf_counter() - began)
                    continue
                async with prof.step(steps()) as n:
                    entry_ms.append((time.perf_counter() - began) * 1e3)
                    await asyncio.gather(
                        *(w.agent_loops.remote(loops, reply_s, on) for w in workers)
                    )
                profiled_steps.append(n)
                seen[name].append(time.perf_counter() - began)
            await prof.flush()
    return {"wall": seen, "entry_ms": entry_ms, "steps": profiled_steps}


def make_profiler(out: str, buffer: int, start: str) -> aprof.Profiler:
    prof = aprof.Profiler(config(os.path.join(out, start), buffer, start))
    for r in range(REPLICAS):
        prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
    return prof


async def start_workers(prof: aprof.Profiler, actors: int) -> list[Any]:
    handle = aprof.ray.share(prof)
    workers = [Worker.remote(handle, k) for k in range(actors)]
    backends_seen = await asyncio.gather(*(w.backend.remote() for w in workers))
    assert set(backends_seen) == {aprof.timeline_backend()}, backends_seen
    await asyncio.gather(*(w.current_step.remote() for w in workers))  # all watching
    return workers


async def stop_workers(workers: list[Any]) -> None:
    await asyncio.gather(*(w.close.remote() for w in workers))
    for w in workers:  # free their CPUs for the next pass's actors
        ray.kill(w)


def counted_requests(manifest: Any, profiled_steps: list[int]) -> list[int]:
    """The distinct numbers of requests admitted per profiled step."""
    counted = dict.fromkeys(profiled_steps, 0)
    for window in manifest.windows:
        if window.step in counted:
            counted[window.step] += window.requests.admitted
    return sorted(set(counted.values()))


async def measure_all(args: argparse.Namespace, out: str) -> dict[str, Any]:
    buffer = max(args.calls, args.loops) + 1000
    results: dict[str, Any] = {"scale": {}, "dropped": 0, "timelines": 0, "notes": []}
    for start in SCALE_PASSES:
        prof = make_profiler(out, buffer, start)
        counter = iter(range(1, 1_000_000))

        def steps(counter: Any = counter) -> int:
            return next(counter)

        async with prof:
            workers = await start_workers(prof, args.actors)
            if start == "on_first_request":
                results["calls"] = await measure_calls(
                    prof, workers, steps, args.calls, args.rounds
                )
                results["first"] = await measure_first(prof, workers, steps, args.first_steps)
            scale = await measure_scale(
                prof, workers, steps, args.loops, args.reply_s, args.steps, args.scale_rounds
            )
            await stop_workers(workers)
        manifest = prof.manifest
        scale["counted"] = counted_requests(manifest, scale.pop("steps"))
        results["scale"][start] = scale
        results["dropped"] += sum(t.dropped for t in manifest.timeline)
        results["timelines"] += len(manifest.timeline)
        results["notes"] += [n.text for n in manifest.notes]
    return results


def measure(args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k == "APROF_NO_EXTENSIONS"}
    ray.init(
        num_cpus=args.actors,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env} if env else None,
    )
    try:
        with tempfile.TemporaryDirectory() as out:
            return asyncio.run(measure_all(args, out))
    finally:
        ray.shutdown()


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--first-steps", type=int, default=50)
    parser.add_argument("--loops", type=int, default=2_500, help="coroutines per actor")
    parser.add_argument("--reply-s", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=2, help="steps per variant and round")
    parser.add_argument("--scale-rounds", type=int, default=3)
    backends.add_arguments(parser)
    parser.set_defaults(recorder="c")
    args = parser.parse_args()
    results = backends.collect(args.recorder, lambda: measure(args))
    if args.json:
        print(json.dumps(results))
        return
    for backend, result in results.items():
        name = backends.NAMES[backend]
        calls = {k: statistics.median(v) for k, v in result["calls"].items()}
        bare_driver, driver, bare_actor, actor = (calls[k] for k in CALL_VARIANTS)
        print(
            f"\n{name} recorder. Per request, median of {args.rounds} rounds of "
            f"{args.calls} calls (one profiled step per round, variants interleaved)\n"
        )
        print("| variant | ns per call | vs bare (same process) | added ns |")
        print("|---|---:|---:|---:|")
        bares = (bare_driver, bare_driver, bare_actor, bare_actor)
        for variant, bare in zip(CALL_VARIANTS, bares, strict=True):
            ns = calls[variant]
            print(f"| {variant} | {ns:.0f} | {ns / bare:.2f}x | {ns - bare:+.0f} |")
        print(
            f"\nremote / in-process: {actor / driver:.2f}x per request, "
            f"{(actor - bare_actor) / (driver - bare_driver):.2f}x of the added cost"
        )

        print(
            f"\nFirst request per (process, step, replica), {args.first_steps} profiled "
            "steps, start_latency=0\n"
        )
        print("| first request | samples | median µs | p90 µs |")
        print("|---|---:|---:|---:|")
        for variant, us in result["first"].items():
            if len(us) >= 2:
                print(f"| {variant} | {len(us)} | {statistics.median(us):.0f} | {p90(us):.0f} |")
            else:
                print(f"| {variant} | {len(us)} | {''.join(f'{u:.0f}' for u in us)} | |")

        total = args.actors * args.loops
        print(
            f"\n{args.actors} actors x {args.loops} concurrent coroutines, one request around "
            f"a {args.reply_s:g} s reply each, wall per step, median of "
            f"{args.scale_rounds * args.steps} steps per variant (variants interleaved), "
            "one pass per `rollout.start`\n"
        )
        print("| `rollout.start` | variant | wall s per step | vs off |")
        print("|---|---|---:|---:|")
        for start, scale in result["scale"].items():
            wall = {k: statistics.median(v) for k, v in scale["wall"].items()}
            off = wall[SCALE_VARIANTS[0]]
            for variant in SCALE_VARIANTS:
                print(f"| {start} | {variant} | {wall[variant]:.3f} | {wall[variant] / off:.3f}x |")
        print()
        for start, scale in result["scale"].items():
            wall = {k: statistics.median(v) for k, v in scale["wall"].items()}
            on, off = (wall[k] for k in reversed(SCALE_VARIANTS))
            entry = scale["entry_ms"]
            print(
                f"{start}: on / off {on / off:.3f}; `prof.step(n)` entry (handshake with every "
                f"actor) median {statistics.median(entry):.1f} ms, max {max(entry):.1f} ms; "
                f"requests counted per profiled step: "
                f"{' or '.join(map(str, scale['counted']))} (expected {total})"
            )
        print(f"timelines: {result['timelines']}, dropped events: {result['dropped']}")
        for note, times in Counter(result["notes"]).items():
            print(f"note ({times}x): {note}")


if __name__ == "__main__":
    main()
