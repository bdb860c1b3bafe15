"""Per-request cost of ``async with prof.request(...)``, side by side in one process.

Compared with a bare ``async with`` of an empty async context manager and with an
OpenTelemetry SDK span, (a) in a global step that is not profiled and (b) in a profiled
step while the replica's window is active. Each variant runs ``--calls`` times per round,
rounds interleaved; the best round of each is reported, in ns per call.
Run with ``nox -s bench`` (or ``python benchmarks/bench_request.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from types import TracebackType

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


async def measure(calls: int, rounds: int) -> dict[str, float]:
    tracer = TracerProvider().get_tracer("bench")
    with tempfile.TemporaryDirectory() as out:
        config = {
            "global_profiler": {"steps": {"every": 2}, "save_path": out, "wait_for_stops": True},
            "rollout": {"forward_steps": None},
            "log": {"level": "warning"},
        }
        aprof.configure_logging(level="warning")
        async with aprof.Profiler(config) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))

            async def bare() -> None:
                for _ in range(calls):
                    async with Empty():
                        pass

            async def request() -> None:
                for _ in range(calls):
                    async with prof.request(replica=0, request_id="r"):
                        pass

            async def otel() -> None:
                for _ in range(calls):
                    with tracer.start_as_current_span("request"):
                        pass

            steps = iter(range(1, 4 * rounds + 1))

            async def unprofiled() -> None:
                async with prof.step(next(steps)) as n:
                    assert n not in prof.config.global_profiler.steps
                    await request()

            async def profiled() -> None:
                async with prof.step(next(steps)) as n:
                    assert n in prof.config.global_profiler.steps
                    async with prof.request(replica=0) as first:
                        assert first.captured
                    await request()

            # unprofiled and profiled alternate so that odd steps are plain, even ones profiled
            variants: dict[str, Callable[[], Awaitable[None]]] = {
                "bare async with": bare,
                "prof.request, unprofiled step": unprofiled,
                "prof.request, active window": profiled,
                "OpenTelemetry SDK span": otel,
            }
            best = dict.fromkeys(variants, float("inf"))
            for _ in range(rounds):
                for name, run in variants.items():
                    began = time.perf_counter_ns()
                    await run()
                    best[name] = min(best[name], (time.perf_counter_ns() - began) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    best = asyncio.run(measure(args.calls, args.rounds))
    bare, otel = best["bare async with"], best["OpenTelemetry SDK span"]
    print(f"| variant | ns per call | vs bare | OpenTelemetry / this |  ({args.calls} calls)")
    print("|---|---:|---:|---:|")
    for name, ns in best.items():
        print(f"| {name} | {ns:.0f} | {ns / bare:.2f}x | {otel / ns:.1f}x |")


if __name__ == "__main__":
    main()
