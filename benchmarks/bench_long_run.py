"""What a window change costs as a run grows: step cost and event-loop stalls at step 1,
1,000 and 10,000, with 64 targets and every step profiled.

Each step opens a window on each of ``--targets`` rollout targets (``rollout.start: on_step``),
sends one request to each replica, and closes them at its end (the step waits for the stops:
``wait_for_stops``), so every step makes ``4 x targets`` window changes, all recorded in the
manifest. The targets answer at once (in-process, no I/O): what is left is aprof's own work.
A probe task sleeps 1 ms over and over and records how late it wakes: the worst lateness is the
longest the probe waited for the event loop (behind the step's own work, a garbage collection,
another thread holding the GIL). The manifest's own part is timed apart: the longest single
pass that turns a step's changes into its file on the event loop (the file is written by a
thread). Reported for the ``--window`` steps ending at each mark: the median step time, the
worst probe stall, the longest manifest pass, the longest garbage collection of the process
(``gc.callbacks``), the size of the step's and the run's manifest files, and the process's
peak memory.

Run with ``nox -s bench`` (or ``python benchmarks/bench_long_run.py``); docs/benchmarks.md has
the table.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aprof
from aprof._manifest import ManifestFiles


class InstantTarget:
    """A rollout target whose captures start and stop at once and write nothing."""

    kind: aprof.TargetKind = "rollout"
    enforces_window = True

    def __init__(self, replica: int) -> None:
        self.name = f"replica_{replica}"
        self.replica: int | None = replica

    async def start(self, window: aprof.Window) -> None:
        return None

    async def stop(self, window: aprof.Window) -> aprof.CaptureResult:
        return aprof.CaptureResult()

    async def forward_steps(self) -> int | None:
        return None


class ManifestTimer:
    """Times every pass of ``ManifestFiles`` that serializes changes on the event loop."""

    def __init__(self) -> None:
        self.worst = 0.0
        original = ManifestFiles._write_marked

        def timed(files: ManifestFiles, **kwargs: bool) -> None:
            began = time.perf_counter()
            original(files, **kwargs)
            self.worst = max(self.worst, time.perf_counter() - began)

        ManifestFiles._write_marked = timed  # type: ignore[method-assign]

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


class GCTimer:
    """The longest garbage collection since the last ``take`` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.worst = max(self.worst, time.perf_counter() - self._began)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


class StallProbe:
    """Sleeps ``interval_s`` over and over; keeps the worst lateness since the last ``take``."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.worst = max(self.worst, time.perf_counter() - before - self.interval_s)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


async def run(steps: int, targets: int, marks: list[int], window: int, save: Path) -> None:
    cfg = {
        "global_profiler": {"steps": {"every": 1}, "save_path": str(save), "wait_for_stops": True},
        "rollout": {"replicas": "all", "start": "on_step", "forward_steps": None},
        "log": {"level": "warning"},
    }
    probe, manifest, collections = StallProbe(), ManifestTimer(), GCTimer()
    prober = asyncio.create_task(probe.run())
    watched = {m - k for m in marks for k in range(window)}
    rows: dict[int, list[tuple[float, float, float, float]]] = {m: [] for m in marks}
    prof = aprof.Profiler(cfg)
    for r in range(targets):
        prof.add_target(InstantTarget(r))
    began = time.perf_counter()
    async with prof:
        for n in range(1, steps + 1):
            probe.take()
            manifest.take()
            collections.take()
            t0 = time.perf_counter()
            async with prof.step(n):
                for r in range(targets):
                    async with prof.request(replica=r):
                        pass
            took = time.perf_counter() - t0
            await asyncio.sleep(0.002)  # the probe's turn, and the manifest thread's
            if n in watched:
                mark = min(m for m in marks if m >= n)
                rows[mark].append((took, probe.take(), manifest.take(), collections.take()))
            if n in marks:
                await prof.flush()  # not timed: the files to measure are on disk
                report(n, rows[n], save)
    prober.cancel()
    total = time.perf_counter() - began
    manifest = aprof.load_manifest(save)
    print(
        f"\n{steps} steps x {targets} targets in {total:.0f} s; "
        f"{len(manifest.windows)} windows read back, "
        f"{sum(w.state == 'done' for w in manifest.windows)} done"
    )


def report(n: int, rows: list[tuple[float, float, float, float]], save: Path) -> None:
    step_ms = statistics.median(r[0] for r in rows) * 1000
    stall_ms, manifest_ms, gc_ms = (max(r[i] for r in rows) * 1000 for i in (1, 2, 3))
    step_file = (save / "manifest" / f"step_{n}.json").stat().st_size
    run_file = (save / "manifest.json").stat().st_size
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"| {n:,} | {step_ms:.1f} | {stall_ms:.1f} | {manifest_ms:.2f} | {gc_ms:.1f} "
        f"| {step_file / 1024:.0f} kB "
        f"| {run_file / 1024:.1f} kB | {rss:.0f} MB |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--window", type=int, default=10, help="steps measured at each mark")
    args = parser.parse_args()
    marks = [m for m in (1, 1_000, 10_000, 100_000, args.steps) if m <= args.steps]
    marks = sorted(set(marks))
    print(
        f"{args.targets} targets, every step profiled; each mark: the {args.window} steps up to it"
    )
    print(
        "| step | step ms (median) | worst probe stall ms | longest manifest pass ms "
        "| longest GC ms | step file | run file | peak RSS |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    save = Path(tempfile.mkdtemp(prefix="aprof-long-run-"))
    try:
        asyncio.run(run(args.steps, args.targets, marks, min(args.window, marks[0] + 9), save))
    finally:
        shutil.rmtree(save, ignore_errors=True)


if __name__ == "__main__":
    main()
