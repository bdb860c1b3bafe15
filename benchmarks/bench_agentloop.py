"""What profiling costs real agent loops: agentloop's ToolAgentLoop at 10,000 concurrent loops.

Each loop is agentloop's ``ToolAgentLoop`` (3 turns, a calculator and a search call on the
first two, ``ScriptedToolCalls`` as the policy) through ``LLMClient`` (balancer, request ids,
``prof.request``), with one thing replaced: the HTTP exchange with a server is an in-process
reply that returns a canned completion after ``--reply-s`` seconds: 0 (it only yields to the
event loop) makes the loops as CPU-bound as they can be, so every cost of aprof shows; 1 s is
the latency of a short answer from a real server. Variants, interleaved per round, best and
median of ``--rounds``: no profiler; a profiler whose steps are not profiled (timeline on);
every step profiled (both replicas captured by ``RecordingTarget``, timeline on), its windows
opened by each step's first request (the default: the first wave of requests waits for them)
or when the step begins (``rollout.start: on_step``). The garbage collector is on, as in a
real program. Besides wall time, each variant's CPU time (this process, the timeline's writer
thread included) and the part of it spent in garbage collection are reported per turn: with
1 s replies the loop idles part of the time, so wall time shows only part of the CPU added.

Every variant runs once per timeline recorder, the C extension and its pure-Python twin, each
in a child process (``--recorder``, default ``both``; ``backends.py``), reported side by side,
each against the no-profiler baseline measured in the same child.

Run with ``nox -s bench`` (or ``python benchmarks/bench_agentloop.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import backends
import structlog

import aprof
from agentloop import (
    AgentLoopRunner,
    LLMClient,
    Sample,
    ScriptedToolCalls,
    ToolAgentLoop,
    calculator,
    make_search,
)
from agentloop._dialects import Answer
from aprof.testing import RecordingTarget

REPLICAS = ("http://127.0.0.1:9", "http://127.0.0.1:10")  # never contacted


class InProcessReplies(LLMClient):
    """``LLMClient`` with the HTTP exchange replaced by an in-process reply after ``reply_s``."""

    reply_s = 0.0

    async def _send(self, replica: int, payload: dict[str, Any], request_id: str | None) -> Answer:
        await asyncio.sleep(self.reply_s)  # a reply always comes back through the event loop
        return Answer(text="the answer is 42", finish_reason="length", completion_tokens=16)


class Measured(NamedTuple):
    wall: float
    cpu: float
    gc: float


class GcClock:
    """Seconds spent in garbage collection since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.total = 0.0
        self._began = 0.0
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._began

    def reset(self) -> None:
        self.total = 0.0


GC = GcClock()

VARIANTS = (
    "profiling off (no profiler)",
    "aprof, unprofiled steps",
    "aprof, profiled steps",
    "aprof, profiled steps, rollout.start: on_step",
)


async def run(
    variant: str, save: Path, loops: int, turns: int, steps: int, reply_s: float
) -> Measured:
    """Wall, CPU and collection seconds of ``steps`` global steps of ``loops`` loops."""
    prof = None
    if variant != VARIANTS[0]:
        selected = [] if variant == VARIANTS[1] else {"every": 1}
        start = "on_step" if variant == VARIANTS[3] else "on_first_request"
        prof = aprof.Profiler(
            {
                "global_profiler": {"steps": selected, "save_path": str(save)},
                "rollout": {"replicas": "all", "forward_steps": None, "start": start},
                "timeline": {"buffer_events": 4 * loops * turns * steps},
                "log": {"level": "warning"},
            }
        )
        for r in range(len(REPLICAS)):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
    llm = InProcessReplies(REPLICAS, prof=prof)
    llm.reply_s = reply_s
    tools = [calculator, make_search(delay_s=0)]
    loop = ToolAgentLoop(llm, tools, parser=ScriptedToolCalls(2), max_turns=turns, max_tokens=16)
    runner = AgentLoopRunner(loop, concurrency=loops)

    async def batch(n: int) -> None:
        samples = (Sample(id=f"s{n}-{i}", prompt="What is 6 * 7? ") for i in range(loops))
        done = await runner.run_batch(samples)
        # Checked, then dropped: a trainer would consume them before the next step.
        assert all(t.ok and len(t.turns) == turns for t in done)

    async with llm:
        GC.reset()
        began, cpu = time.perf_counter(), time.process_time()
        if prof is None:
            for n in range(1, steps + 1):
                await batch(n)
        else:
            async with prof:
                for n in range(1, steps + 1):
                    async with prof.step(n):
                        await batch(n)
        measured = Measured(time.perf_counter() - began, time.process_time() - cpu, GC.total)
    if prof is not None:
        (timeline,) = prof.manifest.timeline
        assert timeline.dropped == 0
    return measured


def measure(args: argparse.Namespace) -> list[dict[str, list[Measured]]]:
    """Per ``--reply-s``, every round of each variant, in this process."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    per_reply = []
    for reply_s in args.reply_s:
        seen: dict[str, list[Measured]] = {variant: [] for variant in VARIANTS}
        with tempfile.TemporaryDirectory() as out:
            for i in range(args.rounds):
                for variant in VARIANTS:
                    save = Path(out, f"{VARIANTS.index(variant)}-{i}")
                    seen[variant].append(
                        asyncio.run(run(variant, save, args.loops, args.turns, args.steps, reply_s))
                    )
        per_reply.append(seen)
    return per_reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--reply-s",
        type=float,
        nargs="+",
        default=[0.0, 1.0],
        help="reply latencies to measure: 0 is the CPU-bound worst case, 1 s a short answer",
    )
    backends.add_arguments(parser)
    args = parser.parse_args()
    results = backends.collect(args.recorder, lambda: measure(args))
    if args.json:
        print(json.dumps(results))
        return
    turns = args.loops * args.turns * args.steps
    for index, reply_s in enumerate(args.reply_s):
        print(
            f"\n{args.loops} concurrent ToolAgentLoops x {args.turns} turns x {args.steps} "
            f"steps, in-process replies after {reply_s:g} s, {args.rounds} rounds\n"
        )
        print(
            "| variant | recorder | best s | vs off | median s | vs off | per turn (median) "
            "| CPU per turn (median) | of it GC |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        # From a child process each Measured comes back as a JSON list.
        per_backend = {
            backend: {v: [Measured(*m) for m in runs] for v, runs in per_reply[index].items()}
            for backend, per_reply in results.items()
        }
        for variant in VARIANTS:
            for backend, seen in per_backend.items():
                off = [m.wall for m in seen[VARIANTS[0]]]
                best_off, median_off = min(off), statistics.median(off)
                cpu_off = statistics.median(m.cpu for m in seen[VARIANTS[0]])
                gc_off = statistics.median(m.gc for m in seen[VARIANTS[0]])
                walls = [m.wall for m in seen[variant]]
                best, median = min(walls), statistics.median(walls)
                cpu = statistics.median(m.cpu for m in seen[variant])
                gc_s = statistics.median(m.gc for m in seen[variant])
                print(
                    f"| {variant} | {backends.NAMES[backend]} | {best:.2f} | "
                    f"{best / best_off - 1:+.1%} | {median:.2f} | "
                    f"{median / median_off - 1:+.1%} | {median / turns * 1e6:.1f} µs "
                    f"({(median - median_off) / turns * 1e6:+.1f}) | {cpu / turns * 1e6:.1f} µs "
                    f"({(cpu - cpu_off) / turns * 1e6:+.1f}) | {gc_s / turns * 1e6:.1f} µs "
                    f"({(gc_s - gc_off) / turns * 1e6:+.1f}) |"
                )


if __name__ == "__main__":
    main()
