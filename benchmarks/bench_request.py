"""What aprof costs an asyncio program: per call, and for many concurrent agent loops.

1. Per call: ``async with prof.request(...)`` and ``prof.span(...)`` side by side in one process
   with a bare ``async with`` of an empty async context manager and an OpenTelemetry SDK span,
   in a global step that is not profiled (timeline off and on) and in a profiled step while the
   replica's window is active. Each variant runs ``--calls`` times per round, rounds
   interleaved, the timeline written between variants; the best round of each is reported,
   and its ratio to the bare ``async with`` of the same round, median over the rounds.
2. Event loop: ``--loops`` concurrent stand-in agent loops of ``--turns`` turns, each turn a
   ``prof.span`` and a ``prof.request`` around a reply that only yields to the loop, over
   ``--steps`` global steps; wall time with aprof (timeline off and on, steps unprofiled and
   profiled) against the same loops without aprof and with two empty async context managers
   per turn instead, best of ``--rounds``. Then the largest stall of the event loop while the
   timeline of one such step is written, seen by a task that sleeps 1 ms and measures how late
   it wakes, against the same probe on an idle loop.

Both parts run once per timeline recorder, the C extension and its pure-Python twin, each in a
child process (``--recorder``, default ``both``; ``backends.py``), and are reported side by
side; each child measures its own baselines (bare ``async with``, OpenTelemetry, no aprof).

Run with ``nox -s bench`` (or ``python benchmarks/bench_request.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from types import TracebackType
from typing import Any

import backends
from opentelemetry.sdk.trace import TracerProvider

import aprof
from aprof.testing import RecordingTarget


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


def config(save: str, *, timeline: bool, buffer: int, steps: object) -> dict[str, Any]:
    return {
        "global_profiler": {"steps": steps, "save_path": save, "wait_for_stops": True},
        "rollout": {"forward_steps": None},
        "timeline": {"enable": timeline, "buffer_events": buffer},
        "log": {"level": "warning"},
    }


# -- 1. per call ------------------------------------------------------------------------------


async def measure_calls(calls: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """ns per call of each variant, best of ``rounds``; and each variant's median over the
    rounds of its time against the bare ``async with`` of the same round."""
    tracer = TracerProvider().get_tracer("bench")
    with tempfile.TemporaryDirectory() as out:
        aprof.configure_logging(level="warning")
        on = aprof.Profiler(
            config(f"{out}/on", timeline=True, buffer=calls + 8, steps={"every": 2})
        )
        off = aprof.Profiler(config(f"{out}/off", timeline=False, buffer=1, steps=[]))
        async with on, off:
            on.add_target(RecordingTarget("replica_0", replica=0))
            last = [0]

            def next_step(profiled: bool) -> int:
                """The next step of ``on`` that is (not) profiled: even ones are."""
                n = last[0] + 1
                n += (n % 2 == 0) != profiled
                last[0] = n
                return n

            async def bare() -> None:
                for _ in range(calls):
                    async with Empty():
                        pass

            async def requests(prof: aprof.Profiler) -> None:
                for _ in range(calls):
                    async with prof.request(replica=0, request_id="r"):
                        pass

            async def spans() -> None:
                for _ in range(calls):
                    async with on.span("turn", turn=1):
                        pass

            async def otel() -> None:
                for _ in range(calls):
                    with tracer.start_as_current_span("request"):
                        pass

            async def unprofiled(prof: aprof.Profiler) -> None:
                async with prof.step(next_step(False) if prof is on else 1) as n:
                    assert n not in prof.config.global_profiler.steps
                    await requests(prof)

            async def traced() -> None:
                """As LLMClient does: each request's trace context read, to send it."""
                async with on.step(next_step(False)) as n:
                    assert n not in on.config.global_profiler.steps
                    for _ in range(calls):
                        async with on.request(replica=0, request_id="r") as req:
                            assert req.traceparent and req.tracestate

            async def profiled() -> None:
                async with on.step(next_step(True)) as n:
                    assert n in on.config.global_profiler.steps
                    async with on.request(replica=0) as first:
                        assert first.captured
                    await requests(on)

            async def unprofiled_span() -> None:
                await spans()

            # `on` alternates unprofiled and profiled steps: odd steps plain, even ones profiled
            variants: dict[str, Callable[[], Awaitable[None]]] = {
                "bare `async with`": bare,
                "`prof.request`, unprofiled step, timeline off": lambda: unprofiled(off),
                "`prof.request`, unprofiled step": lambda: unprofiled(on),
                "`prof.request` + trace context, unprofiled step": traced,
                "`prof.request`, active window": profiled,
                "`prof.span`": unprofiled_span,
                "OpenTelemetry SDK span": otel,
            }
            seen: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(rounds):
                for name, run in variants.items():
                    began = time.perf_counter_ns()
                    await run()
                    seen[name].append((time.perf_counter_ns() - began) / calls)
                    await on.flush()  # not timed: the writer thread is idle again
            assert on.manifest.timeline[0].dropped == 0
    bare = seen["bare `async with`"]
    best = {name: min(ns) for name, ns in seen.items()}
    ratio = {
        name: statistics.median(n / b for n, b in zip(ns, bare, strict=True))
        for name, ns in seen.items()
    }
    return best, ratio


# -- 2. the event loop ------------------------------------------------------------------------


async def stand_in_reply() -> None:
    """An in-process stand-in for the LLM's reply: it only yields to the event loop."""
    await asyncio.sleep(0)


async def agent_loop(prof: aprof.Profiler | Empty | None, sample: int, turns: int) -> None:
    """``turns`` turns, each ``prof.span`` and ``prof.request`` around a stand-in reply;
    ``Empty()``: two empty context managers instead; ``None``: the reply alone."""
    for turn in range(turns):
        if prof is None:
            await stand_in_reply()
            continue
        span: AbstractAsyncContextManager[object]
        request: AbstractAsyncContextManager[object]
        if isinstance(prof, Empty):
            span = request = prof
        else:
            span = prof.span("turn", sample=sample, turn=turn)
            request = prof.request(replica=sample % 2, request_id=f"{sample}-{turn}")
        async with span, request:
            await stand_in_reply()


async def run_steps(
    prof: aprof.Profiler | Empty | None, loops: int, turns: int, steps: int
) -> float:
    """Wall seconds of ``steps`` steps of ``loops`` concurrent agent loops."""
    began = time.perf_counter()
    for n in range(1, steps + 1):
        step = prof.step(n) if isinstance(prof, aprof.Profiler) else nullcontext()
        async with step:
            await asyncio.gather(*(agent_loop(prof, i, turns) for i in range(loops)))
    return time.perf_counter() - began


async def with_profiler(
    save: Path,
    timeline: bool,
    profiled: bool,
    buffer: int,
    body: Callable[[aprof.Profiler], Awaitable[float]],
) -> float:
    steps = {"every": 1} if profiled else []
    prof = aprof.Profiler(config(str(save), timeline=timeline, buffer=buffer, steps=steps))
    async with prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        result = await body(prof)
    assert not prof.manifest.timeline or prof.manifest.timeline[0].dropped == 0
    return result


async def probe(stop: asyncio.Event) -> float:
    """Largest lateness, in seconds, of a 1 ms sleep until ``stop`` is set."""
    worst = 0.0
    while not stop.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.001)
        worst = max(worst, time.perf_counter() - began - 0.001)
    return worst


LOOP_VARIANTS: dict[str, tuple[bool, bool] | Empty | None] = {
    "no aprof": None,
    "two empty `async with` per turn instead": Empty(),
    "aprof, unprofiled steps, timeline off": (False, False),
    "aprof, unprofiled steps, timeline on": (True, False),
    "aprof, profiled steps (replica 0 captured), timeline on": (True, True),
}


async def measure_loops(loops: int, turns: int, steps: int, rounds: int) -> dict[str, float]:
    buffer = 2 * loops * turns + 64
    best = dict.fromkeys(LOOP_VARIANTS, float("inf"))
    with tempfile.TemporaryDirectory() as out:
        for i in range(rounds):
            for name, variant in LOOP_VARIANTS.items():
                if not isinstance(variant, tuple):
                    wall = await run_steps(variant, loops, turns, steps)
                else:
                    wall = await with_profiler(
                        Path(out, f"{len(name)}-{i}"),
                        *variant,
                        buffer,
                        lambda prof: run_steps(prof, loops, turns, steps),
                    )
                best[name] = min(best[name], wall)

        async def flush_stall(prof: aprof.Profiler) -> float:
            async with prof.step(1):
                await asyncio.gather(*(agent_loop(prof, i, turns) for i in range(loops)))
            # The step's end handed its spans to the writer thread; the probe runs meanwhile.
            stop = asyncio.Event()
            lag = asyncio.create_task(probe(stop))
            await prof.flush()  # queued behind the step's write: waits for both
            stop.set()
            assert prof.manifest.timeline[0].events >= 2 * loops * turns
            return await lag

        stalls, idle = [], []
        for i in range(rounds):
            stall = await with_profiler(Path(out, f"stall{i}"), True, False, buffer, flush_stall)
            stalls.append(stall)
            stop = asyncio.Event()
            lag = asyncio.create_task(probe(stop))
            await asyncio.sleep(0.2)
            stop.set()
            idle.append(await lag)
    best["stall"] = min(stalls)
    best["stall, worst round"] = max(stalls)
    best["idle"] = max(idle)
    return best


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Both parts' results in this process: ``calls`` (ns per call), ``ratios`` (per call,
    against the bare ``async with``, median of the rounds), ``loops`` (seconds)."""
    calls, ratios = asyncio.run(measure_calls(args.calls, args.rounds))
    loops = asyncio.run(measure_loops(args.loops, args.turns, args.steps, args.rounds))
    return {"calls": calls, "ratios": ratios, "loops": loops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--loops", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    backends.add_arguments(parser)
    args = parser.parse_args()
    results = backends.collect(args.recorder, lambda: measure(args))
    if args.json:
        print(json.dumps(results))
        return
    names = [backends.NAMES[backend] for backend in results]

    print(
        f"Per call, best of {args.rounds} rounds of {args.calls} calls; vs bare also as the "
        "median over the rounds of each round's own ratio\n"
    )
    columns = ("ns per call", "vs bare", "vs bare, median", "OpenTelemetry / this")
    print("| variant | " + " | ".join(f"{c} ({n})" for n in names for c in columns) + " |")
    print("|---|" + "---:|" * len(columns) * len(names))
    for name in next(iter(results.values()))["calls"]:
        cells = []
        for result in results.values():
            best = result["calls"]
            ns, bare = best[name], best["bare `async with`"]
            otel = best["OpenTelemetry SDK span"]
            median = result["ratios"][name]
            cells += [f"{ns:.0f}", f"{ns / bare:.2f}x", f"{median:.2f}x", f"{otel / ns:.1f}x"]
        print(f"| {name} | " + " | ".join(cells) + " |")

    print(
        f"\n{args.loops} concurrent agent loops x {args.turns} turns x {args.steps} steps, "
        f"best of {args.rounds}\n"
    )
    columns = ("wall s", "vs no aprof", "per turn")
    print("| variant | " + " | ".join(f"{c} ({n})" for n in names for c in columns) + " |")
    print("|---|" + "---:|" * len(columns) * len(names))
    for name in LOOP_VARIANTS:
        cells = []
        for result in results.values():
            loops = result["loops"]
            wall, none = loops[name], loops["no aprof"]
            extra_us = (wall - none) / (args.loops * args.turns * args.steps) * 1e6
            cells += [f"{wall:.3f}", f"{wall / none - 1:+.1%}", f"{extra_us:+.2f} µs"]
        print(f"| {name} | " + " | ".join(cells) + " |")

    print()
    for name, result in zip(names, results.values(), strict=True):
        loops = result["loops"]
        print(
            f"{name} recorder: largest event-loop stall while one step's timeline "
            f"({2 * args.loops * args.turns} spans) is written: {loops['stall'] * 1e3:.2f} ms "
            f"in the best round, {loops['stall, worst round'] * 1e3:.2f} ms in the worst "
            f"(the same probe on an idle loop: {loops['idle'] * 1e3:.2f} ms)"
        )


if __name__ == "__main__":
    main()
