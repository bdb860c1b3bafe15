"""What the control channel and the triggers cost a step, at the start of a run and at step
10,000, side by side with both off.

One process opens one profiler per variant, all at once (``global_profiler.steps: []``: no
step is profiled and no target is registered; the timeline on, as by default), and runs
``--steps`` empty global steps through each, every step carrying one request
(``async with prof.request(replica=0): pass``, so that ``slow_rollout`` has a rollout to
measure; in every variant, so that they stay comparable). The variants take turns in blocks
of ``--block`` steps, the order rotated each round, and each block is followed by an untimed
``prof.flush()`` so that the next one starts with the writer threads idle. The variants:

1. ``control: {enable: false}``, no trigger;
2. ``control: {enable: true}`` (the default: the control folder read at each step boundary,
   by the disk thread), no trigger;
3. the same with both triggers at their defaults (``slow_step: {}``, ``slow_rollout: {}``);
4. the same as 3, with a capture request written into the control folder every 100 steps
   (``ControlFolder.submit``, untimed); with no target registered each is refused ("the run
   has no capture target to capture"), which still reads, decides and answers it;
5. a reference that no config reaches: variant 1 with ``Control.write_status`` patched out, to
   show what the run's status (``control/status.json``) costs a step; it is written at each
   step boundary whatever ``control.enable`` says.

Each step is timed on the event loop from entering ``prof.step(n)`` to leaving it; reported for
the first and the last ``--window`` steps: the median and mean microseconds per step, what
variants 2-5 add to variant 1, and the process's CPU per step (every thread of it, the block's
flush included: the folder reads and the file writes are done by threads). A second table says
what the channel did over the whole run: status writes per step and their cost on the event
loop, folder reads per step and their cost in the disk thread, the triggers' fires and the
answers written. Empty steps are the worst case for the triggers: a step of some 50 µs is
often twice its median (a garbage collection, the other threads), so both fire as often as
their cooldown lets them; the log is set to ``error`` to keep their warnings off the console.

Run with ``nox -s bench`` (or ``python benchmarks/bench_control.py``); docs/benchmarks.md has
the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aprof
from aprof._control import CaptureRequest, ControlFolder
from aprof._core.on_demand import Control

REQUEST_EVERY = 100
"""Variant 4 writes a capture request into the control folder every this many steps."""


@dataclass
class Variant:
    name: str
    control: bool
    triggers: bool
    requests: bool = False
    no_status: bool = False


VARIANTS = (
    Variant("control off, no trigger", control=False, triggers=False),
    Variant("control on, no trigger", control=True, triggers=False),
    Variant("control on, both triggers", control=True, triggers=True),
    Variant(
        f"control on, both triggers, a request every {REQUEST_EVERY} steps",
        control=True,
        triggers=True,
        requests=True,
    ),
    Variant(
        "reference: control off, status writes patched out (no config does this)",
        control=False,
        triggers=False,
        no_status=True,
    ),
)


@dataclass
class Costs:
    """What one variant's control channel did: calls and nanoseconds."""

    status_writes: int = 0
    status_ns: int = 0
    folder_reads: int = 0
    folder_ns: int = 0
    folder_cpu_ns: int = 0


@dataclass
class Run:
    variant: Variant
    save: Path
    prof: aprof.Profiler
    costs: Costs = field(default_factory=Costs)
    step_ns: list[int] = field(default_factory=list)
    cpu_ns: list[tuple[int, int, int]] = field(default_factory=list)
    """(first step, last step, process CPU ns) per block."""


class ChannelTimer:
    """Counts and times ``Control.write_status`` (on the event loop) and
    ``ControlFolder.take`` (in the disk thread), per run."""

    def __init__(self) -> None:
        self.by_control: dict[int, Costs] = {}
        self.by_root: dict[Path, Costs] = {}
        self._lock = threading.Lock()
        write_status = Control.write_status
        take = ControlFolder.take

        def timed_status(control: Control) -> None:
            began = time.perf_counter_ns()
            write_status(control)
            costs = self.by_control.get(id(control))
            if costs is not None:
                costs.status_writes += 1
                costs.status_ns += time.perf_counter_ns() - began

        def timed_take(folder: ControlFolder) -> Any:
            began, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return take(folder)
            finally:
                took, cpu = time.perf_counter_ns() - began, time.thread_time_ns() - cpu
                costs = self.by_root.get(folder.root)
                if costs is not None:
                    with self._lock:
                        costs.folder_reads += 1
                        costs.folder_ns += took
                        costs.folder_cpu_ns += cpu

        Control.write_status = timed_status  # type: ignore[method-assign]
        ControlFolder.take = timed_take  # type: ignore[method-assign]

    def watch(self, run: Run) -> None:
        self.by_control[id(run.prof._control)] = run.costs
        self.by_root[run.save.resolve()] = run.costs
        self.by_root[run.save] = run.costs


def config(save: Path, variant: Variant) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "global_profiler": {"steps": [], "save_path": str(save)},
        "control": {"enable": variant.control},
        "log": {"level": "error"},
    }
    if variant.triggers:
        cfg["triggers"] = {"slow_step": {}, "slow_rollout": {}}
    return cfg


async def block(run: Run, first: int, last: int) -> None:
    """Steps ``first`` to ``last`` of ``run``, each timed; then the untimed flush."""
    prof, times, folder = run.prof, run.step_ns, ControlFolder(run.save)
    cpu = time.process_time_ns()
    for n in range(first, last + 1):
        if run.variant.requests and n % REQUEST_EVERY == 0:
            folder.submit(CaptureRequest(id=f"bench-{n}", next=1))
        began = time.perf_counter_ns()
        async with prof.step(n), prof.request(replica=0):
            pass
        times.append(time.perf_counter_ns() - began)
    await prof.flush()
    run.cpu_ns.append((first, last, time.process_time_ns() - cpu))


async def warm_up(save: Path, steps: int) -> None:
    """Steps through a profiler with everything on (variant 4's config, a request every 10
    steps), untimed: the first block measured pays for no first call of anything."""
    folder = ControlFolder(save)
    async with aprof.Profiler(config(save, VARIANTS[3])) as prof:
        for n in range(1, steps + 1):
            if n % 10 == 0:
                folder.submit(CaptureRequest(id=f"warm-up-{n}", next=1))
            async with prof.step(n), prof.request(replica=0):
                pass
            if n % 50 == 0:
                await prof.flush()


async def measure(steps: int, block_steps: int, root: Path) -> list[Run]:
    await warm_up(root / "warm_up", 500)
    timer = ChannelTimer()
    runs: list[Run] = []
    for i, variant in enumerate(VARIANTS, 1):
        save = root / f"variant_{i}"
        run = Run(variant, save, aprof.Profiler(config(save, variant)))
        timer.watch(run)
        if variant.no_status:
            run.prof._control.write_status = lambda: None  # type: ignore[method-assign]
        runs.append(run)
    async with contextlib.AsyncExitStack() as stack:
        for run in runs:
            await stack.enter_async_context(run.prof)
        for r, first in enumerate(range(1, steps + 1, block_steps)):
            last = min(first + block_steps - 1, steps)
            for k in range(len(runs)):
                await block(runs[(r + k) % len(runs)], first, last)
    return runs


def window_stats(run: Run, first: int, last: int) -> tuple[float, float, float]:
    """Median and mean µs per step, and process CPU µs per step, over steps first..last."""
    us = [ns / 1000 for ns in run.step_ns[first - 1 : last]]
    blocks = [(a, b, ns) for a, b, ns in run.cpu_ns if a >= first and b <= last]
    cpu = sum(ns for _, _, ns in blocks) / max(1, sum(b - a + 1 for a, b, _ in blocks)) / 1000
    return statistics.median(us), statistics.mean(us), cpu


def report(runs: list[Run], steps: int, window: int, block_steps: int, took: float) -> None:
    start, end = (1, window), (steps - window + 1, steps)

    def label(span: tuple[int, int]) -> str:
        return f"steps {span[0]:,}-{span[1]:,}"

    base = {span: window_stats(runs[0], *span) for span in (start, end)}
    print(
        f"\n{len(runs)} profilers in one process, {steps:,} empty steps each (one request per "
        f"step), blocks of {block_steps} steps taking turns; timeline recorder: "
        f"{aprof.timeline_backend()}; {took:.0f} s in all; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end. "
        "µs per step on the event loop (median / mean); added: against variant 1 in the "
        "same steps; CPU: the process's per step, its threads included\n"
    )
    cols = [f"{label(s)} {c}" for s in (start, end) for c in ("µs", "added µs", "CPU µs")] + [
        "end / start (median / mean)"
    ]
    print("| variant | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for i, run in enumerate(runs, 1):
        cells: list[str] = []
        medians: list[float] = []
        means: list[float] = []
        for span in (start, end):
            median, mean, cpu = window_stats(run, *span)
            b_median, b_mean, b_cpu = base[span]
            medians.append(median)
            means.append(mean)
            cells += [
                f"{median:.1f} / {mean:.1f}",
                "" if i == 1 else f"{median - b_median:+.1f} / {mean - b_mean:+.1f}",
                f"{cpu:.0f}" if i == 1 else f"{cpu:.0f} ({cpu - b_cpu:+.0f})",
            ]
        cells.append(f"{medians[1] / medians[0]:.2f}x / {means[1] / means[0]:.2f}x")
        print(f"| {i}. {run.variant.name} | " + " | ".join(cells) + " |")

    print(
        "\nWhat the channel did over the whole run (status: `Control.write_status` on the "
        "event loop; folder: `ControlFolder.take` in the disk thread)\n"
    )
    print(
        "| variant | status writes per step | µs per status write | folder reads per step "
        "| µs per folder read: wall / thread CPU | triggers fired | answers (refused) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, run in enumerate(runs, 1):
        c = run.costs
        status = ControlFolder(run.save).status()
        fired = {t.name: t.fired for t in status.triggers} if status else {}
        answers = list((run.save / "control" / "answers").glob("*.json"))
        refused = sum(
            not a.accepted
            for a in (ControlFolder(run.save).answer(p.stem) for p in answers)
            if a is not None
        )
        fires = ", ".join(f"{k} {v}" for k, v in fired.items()) or "-"
        print(
            f"| {i}. {run.variant.name} | {c.status_writes / steps:.2f} "
            f"| {c.status_ns / 1000 / max(1, c.status_writes):.1f} "
            f"| {c.folder_reads / steps:.2f} "
            f"| {c.folder_ns / 1000 / max(1, c.folder_reads):.0f} "
            f"/ {c.folder_cpu_ns / 1000 / max(1, c.folder_reads):.0f} "
            f"| {fires} | {len(answers)} ({refused}) |"
        )
    slices = range(1, steps + 1, window)
    print(
        f"\nMedian µs per step in each slice of {window:,} steps (flat: no growth with the step)\n"
    )
    print(
        "| variant | " + " | ".join(f"{a:,}-{min(a + window - 1, steps):,}" for a in slices) + " |"
    )
    print("|---|" + "---:|" * len(slices))
    for i, run in enumerate(runs, 1):
        cells = [
            f"{statistics.median(run.step_ns[a - 1 : a - 1 + window]) / 1000:.0f}" for a in slices
        ]
        print(f"| {i}. {run.variant.name} | " + " | ".join(cells) + " |")
    folder = ControlFolder(runs[3].save)
    written = [f"bench-{n}" for n in range(REQUEST_EVERY, steps + 1, REQUEST_EVERY)]
    answers = [a for a in map(folder.answer, written) if a is not None]
    reasons = sorted({a.reason or "" for a in answers if not a.accepted})
    left = len(list((runs[3].save / "control" / "requests").glob("*.json")))
    print(
        f"\nVariant 4: {len(written)} requests written, {len(answers)} answered "
        f"({sum(a.accepted for a in answers)} accepted; refused: {'; '.join(reasons) or '-'}), "
        f"{left} still in the folder when the run ended (the rest read, not yet decided)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=1_000, help="steps at each end measured")
    parser.add_argument("--block", type=int, default=100, help="steps per turn of a variant")
    args = parser.parse_args()
    window = min(args.window, args.steps // 2)
    root = Path(tempfile.mkdtemp(prefix="aprof-control-"))
    try:
        began = time.perf_counter()
        runs = asyncio.run(measure(args.steps, args.block, root))
        report(runs, args.steps, window, args.block, time.perf_counter() - began)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
