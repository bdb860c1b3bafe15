"""``aprof demo``: the scheduler end to end on simulated replicas, with a table of windows.

The simulated replicas stand in for inference servers until the embedded reference server
lands: each request runs a few engine forward steps on its replica, so auto-stop, gating and
the manifest behave as they do against a real server.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path

from aprof._config import load_config
from aprof._errors import ConfigError
from aprof._manifest import Manifest
from aprof._scheduler import Profiler
from aprof.testing import RecordingTarget


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``demo`` subcommand."""
    parser = sub.add_parser(
        "demo",
        help="run a small profiled async RL loop and show what was captured",
        description=__doc__,
    )
    parser.add_argument("--steps", default="1,2,5", help="global steps to profile (default 1,2,5)")
    parser.add_argument("--num-steps", type=int, default=6, help="global steps to run (default 6)")
    parser.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    parser.add_argument("--concurrency", type=int, default=32, help="agent loops per step")
    parser.add_argument("--forward-steps", type=int, default=8, help="auto-stop after N steps")
    parser.add_argument("--out", type=Path, default=Path("aprof-demo"), help="output folder")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 on success, 1 with one line on stderr on bad input."""
    for flag in ("num_steps", "replicas", "concurrency", "forward_steps"):
        if getattr(args, flag) < 1:
            print(f"aprof demo: --{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 1
    try:
        config = load_config(
            {
                "global_profiler": {"steps": args.steps, "save_path": str(args.out)},
                "rollout": {"replicas": "all", "forward_steps": args.forward_steps},
                "timeouts": {"poll_s": 0.001},
                "log": {"level": "warning"},
            }
        )
        manifest = asyncio.run(_main(args, Profiler(config)))
    except ConfigError as exc:
        print(f"aprof demo: {exc}", file=sys.stderr)
        return 1
    _print_table(manifest, args.out)
    return 0


class _Engine:
    """A simulated inference replica: one batched forward step every tick while busy."""

    def __init__(self, target: RecordingTarget) -> None:
        self.target = target
        self.running = 0
        self._tick = asyncio.Condition()

    async def run(self) -> None:
        while True:  # ends when the demo cancels it
            await asyncio.sleep(0.002)
            if self.running:
                async with self._tick:
                    self.target.advance()
                    self._tick.notify_all()

    async def generate(self, tokens: int) -> None:
        self.running += 1
        try:
            for _ in range(tokens):
                async with self._tick:
                    await self._tick.wait()
        finally:
            self.running -= 1


async def _main(args: argparse.Namespace, prof: Profiler) -> Manifest:
    rng = random.Random(0)
    engines = [_Engine(RecordingTarget(f"replica_{r}", replica=r)) for r in range(args.replicas)]
    for engine in engines:
        prof.add_target(engine.target)

    async def agent_loop(step: int, sample: int) -> None:
        replica = sample % len(engines)
        for turn in range(3):
            async with prof.request(replica=replica, request_id=f"s{step}-{sample}-{turn}"):
                await engines[replica].generate(rng.randint(2, 6))
            await asyncio.sleep(rng.random() * 0.005)  # a tool call between turns

    async with prof, asyncio.TaskGroup() as background:
        ticking = [background.create_task(engine.run()) for engine in engines]
        for step in range(1, args.num_steps + 1):
            async with prof.step(step), asyncio.TaskGroup() as loops:
                for sample in range(args.concurrency):
                    loops.create_task(agent_loop(step, sample))
            print(f"step {step}/{args.num_steps} done", file=sys.stderr)
        for task in ticking:
            task.cancel()
    return prof.manifest


def _print_table(manifest: Manifest, out: Path) -> None:
    header = ("step", "target", "state", "stop", "fwd req/obs", "gated/admitted", "files", "bytes")
    rows = [header]
    for w in manifest.windows:
        fs = w.forward_steps
        rows.append(
            (
                str(w.step),
                w.target,
                w.state,
                w.stop_reason or "-",
                f"{fs.requested if fs.requested is not None else '-'}/"
                f"{fs.observed if fs.observed is not None else '-'}",
                f"{w.requests.gated}/{w.requests.admitted}",
                str(len(w.files)),
                str(sum(f.bytes for f in w.files)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"\nmanifest: {out / 'manifest.json'}")
