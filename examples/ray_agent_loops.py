"""Agent loops in several Ray actors, profiled through one driver's ``aprof.Profiler``, on CPU.

The driver launches two reference servers (subprocesses, vLLM dialect), opens a profiler with
one rollout target per server and shares it (``aprof.ray.share``). ``--workers`` async Ray
actors join it (``aprof.ray.connect``); at every step each one rolls out ``--loops`` multi-turn
tool-calling agent loops over both servers. Each profiled step gets one capture window per
replica, started once, by the driver, whichever actor's request comes first; the table at the
end shows the windows with the requests the actors counted in them, then the timeline files,
one per process.

Run: python examples/ray_agent_loops.py --out outputs/ray-agents --steps 1,3 --num-steps 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import ray

import aprof
import aprof.ray
from agentloop import (
    AgentLoopRunner,
    LLMClient,
    Sample,
    ScriptedToolCalls,
    ToolAgentLoop,
    calculator,
    search,
)
from servers import launch, launch_spec
from servers.process import free_port

REPLICAS = 2
REFERENCE_VERSION = "0.32.0"
"""The vLLM release the reference servers imitate: per-capture bounds, so they auto-stop."""
PROMPTS = (
    "Add the numbers and look up what you need: ",
    "Plan the next tool call. ",
    "Question: how does continuous batching work? ",
    "Compute, then search, then answer. ",
)


class Rollouts(NamedTuple):
    """What one worker rolled out in one step."""

    worker: str
    step: int | None
    """The step the worker saw open (the driver's, once ``prof.step`` is entered)."""
    failed: int
    requests: Counter[int]
    """Answered requests of the step, per replica."""


class AgentLoopWorker:
    """One Ray actor of agent loops; its requests are gated and counted by the driver."""

    def __init__(self, handle: aprof.ray.ShareHandle, rank: int, urls: list[str]) -> None:
        # An async actor's constructor runs in its event loop, where the requests will run.
        self.prof = aprof.ray.connect(handle, role="agent_loop_worker", rank=rank)
        aprof.configure_logging(self.prof.config.log.format, self.prof.config.log.level)
        self.llm = LLMClient(urls, prof=self.prof, timeout_s=120.0)
        loop = ToolAgentLoop(
            self.llm, [calculator, search], parser=ScriptedToolCalls(2), max_turns=3, max_tokens=8
        )
        self.runner = AgentLoopRunner(loop, concurrency=64)

    async def ready(self) -> str:
        """Open the HTTP session; this process's name among the driver's."""
        await self.llm.open()
        return self.prof.name

    async def rollout(self, step: int, loops: int) -> Rollouts:
        """Roll out ``loops`` samples of ``step``."""
        samples = [
            Sample(id=f"{self.prof.name}-s{step}-{i}", prompt=PROMPTS[i % len(PROMPTS)])
            for i in range(loops)
        ]
        batch = await self.runner.run_batch(samples)
        turns = [turn for traj in batch for turn in traj.turns]
        return Rollouts(
            worker=self.prof.name,
            step=self.prof.current_step,
            failed=sum(not traj.ok for traj in batch),
            requests=Counter(turn.replica for turn in turns if turn.step == step),
        )

    async def close(self) -> None:
        """Write this process's timeline and hand the last counts to the driver."""
        await self.llm.aclose()
        await self.prof.aclose()


async def drive(args: argparse.Namespace, config: aprof.ProfilerConfig) -> aprof.Manifest:
    """The driver: servers, the shared profiler, the workers, then the steps."""
    out = config.global_profiler.save_path
    async with contextlib.AsyncExitStack() as stack:
        # Entered before the profiler, left after it: the servers outlive its final stops.
        specs = [
            launch_spec("reference", config, version=REFERENCE_VERSION, port=free_port())
            for _ in range(REPLICAS)
        ]
        say(f"launching {REPLICAS} reference servers (logs in {out / 'logs'})")
        for r, spec in enumerate(specs):
            server = await launch(spec, log_path=out / "logs" / f"replica_{r}.log")
            stack.push_async_callback(server.aclose)
        prof = aprof.Profiler(config)
        for r, spec in enumerate(specs):
            prof.add_target(spec.adapter(replica=r))
        await stack.enter_async_context(prof)
        handle = aprof.ray.share(prof)
        urls = [spec.base_url for spec in specs]
        actor = ray.remote(AgentLoopWorker).options(num_cpus=0)
        workers: list[Any] = [actor.remote(handle, k, urls) for k in range(args.workers)]
        # Closed before the profiler: their last reports reach it before it writes the manifest.
        stack.push_async_callback(close_all, workers)
        names = await asyncio.gather(*(w.ready.remote() for w in workers))
        say(f"workers {', '.join(names)}; profiling steps {args.steps} of {args.num_steps}")
        for n in range(1, args.num_steps + 1):
            began = time.monotonic()
            async with prof.step(n):
                results = await asyncio.gather(*(w.rollout.remote(n, args.loops) for w in workers))
            progress(prof, n, results, began)
    return prof.manifest


async def close_all(workers: list[Any]) -> None:
    # A worker that fails to close costs its own last counts only; the manifest notes it.
    await asyncio.gather(*(w.close.remote() for w in workers), return_exceptions=True)


def progress(prof: aprof.Profiler, n: int, results: list[Rollouts], began: float) -> None:
    sent: Counter[int] = Counter()
    for result in results:
        sent.update(result.requests)
    failed = sum(result.failed for result in results)
    behind = [result.worker for result in results if result.step != n]
    per_replica = ", ".join(f"replica {r}: {sent[r]}" for r in sorted(sent))
    windows = [w for w in prof.manifest.windows if w.step == n]
    captured = ", ".join(f"{w.target} {w.state}" for w in windows) or "not profiled"
    say(
        f"step {n}: {len(results)} workers, {failed} failed rollouts, answered requests "
        f"{per_replica}, {time.monotonic() - began:.1f}s; {captured}"
        + (f"; did not see the step: {', '.join(behind)}" if behind else "")
    )


def print_table(manifest: aprof.Manifest, out: Path) -> None:
    header = ("step", "target", "state", "stop", "fwd req/obs", "admitted/gated", "files")
    rows = [header]
    for w in manifest.windows:
        fs = w.forward_steps
        rows.append(
            (
                str(w.step),
                w.target,
                w.state,
                w.stop_reason or "-",
                f"{'-' if fs.requested is None else fs.requested}/"
                f"{'-' if fs.observed is None else fs.observed}",
                f"{w.requests.admitted}/{w.requests.gated}",
                str(len(w.files)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"\nmanifest: {out / 'manifest.json'}")
    for timeline in manifest.timeline:
        print(f"timeline: {out / timeline.path} ({timeline.process} on {timeline.host})")
    for note in manifest.notes:
        print(f"note (step {note.step}, {note.target or 'run'}): {note.text}")
    print("open the timelines and trace files (*.trace.json.gz) in https://ui.perfetto.dev")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("aprof-ray-agents"), help="save_path")
    parser.add_argument("--steps", default="1,3", help="profiled steps (default 1,3)")
    parser.add_argument("--num-steps", type=int, default=4, help="steps to run (default 4)")
    parser.add_argument("--workers", type=int, default=4, help="agent-loop actors (default 4)")
    parser.add_argument("--loops", type=int, default=64, help="agent loops per worker and step")
    args = parser.parse_args()
    config = aprof.load_config(
        {
            "global_profiler": {
                "steps": args.steps,
                "save_path": str(args.out.resolve()),  # the actors write below it too
                "wait_for_stops": True,
            },
            "rollout": {"replicas": "all", "forward_steps": 8},
            "log": {"level": "warning"},
        }
    )
    aprof.configure_logging(config.log.format, config.log.level)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        manifest = asyncio.run(drive(args, config))
    finally:
        ray.shutdown()
    print_table(manifest, config.global_profiler.save_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
