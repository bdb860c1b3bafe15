"""What ``aprof report`` costs as a run grows: reading back 1,000 and 10,000 steps with their
accounts (where each step's time went), side by side.

A real profiler run is too slow for 10,000 steps, so each run folder is synthesized: the
timeline files are written by aprof's own ``ChromeTraceWriter`` from the events a run records
(``aprof._timeline.events``), and ``manifest.json`` is the ``RunFile`` model a live run writes
(``aprof._manifest``), listing every timeline part. The run has ``--processes`` processes: a
driver and agent-loop workers, each on its own monotonic clock (its own anchor). Per step:

- the driver's ``STEP`` span, a step beginning about every second;
- in every process, ``--requests`` ``REQUEST`` spans (replica ``i % 4``, about 100 tokens),
  begun over the first 50 ms of the step, latencies log-normal (median 150 ms, at most
  550 ms) with a long tail: one request in 500 takes 1.5-2.5x longer, and one step in 200
  has a 2.5 s straggler (the accounts' anomaly rule fires on those);
- after the last request, the driver's trainer stage (``SPAN`` ``update_actor`` with
  ``aprof="stage"``, as ``prof.stage`` records it), about 300 ms.

Each process's events are written every ``WRITE_EVERY`` steps, as a live run writes them at its
flushes, so a timeline passing 32 MiB is split into parts as a real one is. Two steps are
profiled (``PROFILED``: a trainer window each, listed in the manifest; they hold no trace), so
the report builds their detail from the timeline parts holding them, and the accounts of every
step, the part that grows with the run. Each run is also reported without its ledgers (moved
aside: the report reads every timeline's JSON, as an older run's), side by side.

Each run's ``aprof._report.accounting(save_path)`` (what ``aprof report --json`` and ``aprof
status`` read: every step's account, from the timeline writers' ledgers) is timed in a fresh
process too, beside the whole report. Each run's ``aprof._report.collect(save_path)`` is timed
in a fresh process (best of
``--repeat``; that process's peak RSS is reported too), which also checks that the report read
every step and request; then once more in a fresh process under ``tracemalloc``, for its peak of
Python memory (traced apart: tracing slows the report several times; ``--trace-steps`` leaves
longer runs untraced). Where the report is linear in the run, the 10,000-step run costs 10x
the 1,000-step one in time, and its memory stays near what the largest timeline part read
needs, not the run's sum (one input in memory at a time).

Run with ``nox -s bench`` (or ``python benchmarks/bench_report_accounting.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aprof
from aprof._accounting.ledger import LEDGER_SUFFIX
from aprof._manifest import Clock, TimelineFile
from aprof._manifest.model import FILENAME, STEPS_FOLDER, RunFile, StepFile, WindowRecord
from aprof._timeline.chrome_trace import ChromeTraceWriter, part_name
from aprof._timeline.events import REQUEST, SPAN, STEP, Event

WRITE_EVERY = 250
"""Steps of events per write of a timeline file (each write extends the current part)."""
WALL_NS = 1_790_000_000_000_000_000
"""The run's start on the wall clock."""
S = 1_000_000_000


def lognormal_ns(rng: random.Random, median_s: float, sigma: float) -> int:
    return round(median_s * math.exp(rng.gauss(0.0, sigma)) * S)


def profiled(steps: int) -> set[int]:
    """The steps with a window: an early one and the middle one."""
    return {10, steps // 2}


def plan(steps: int, processes: int, requests: int, seed: int) -> list[list[Event]]:
    """Every process's events, on one wall clock relative to the run's start (ns)."""
    rng = random.Random(seed)
    events: list[list[Event]] = [[] for _ in range(processes)]
    begin = S
    for n in range(1, steps + 1):
        straggler = n % 200 == 0
        last = begin
        for p, mine in enumerate(events):
            for i in range(requests):
                start = begin + 2_000_000 + rng.randrange(50_000_000)
                latency = min(lognormal_ns(rng, 0.15, 0.5), 550_000_000)
                if rng.random() < 0.002:  # the long tail: some step in two has one
                    latency = round(latency * rng.uniform(1.5, 2.5))
                if straggler and p == 0 and i == 0:
                    latency = 2_500_000_000
                end = start + latency
                last = max(last, end)
                tokens = max(1, round(rng.gauss(100, 20)))
                mine.append(
                    (
                        REQUEST,
                        start,
                        end,
                        i % 4,
                        f"req-{n}-{p}-{i}",
                        n,
                        False,
                        False,
                        tokens,
                        200,
                        f"traj-{n}-{p}-{i}",
                        0,
                        None,
                    )
                )
        train_begin = last + 5_000_000
        train_end = train_begin + lognormal_ns(rng, 0.3, 0.05)
        events[0].append((SPAN, "update_actor", train_begin, train_end, n, None, "aprof", "stage"))
        end = train_end + 2_000_000
        events[0].append((STEP, begin, end, n, n in profiled(steps)))
        # The next step begins a second after this one, or at once after a slow one.
        begin = max(begin + S, end + 5_000_000)
    return events


def synthesize(root: Path, steps: int, processes: int, requests: int) -> tuple[int, int, int]:
    """A run folder of ``steps`` steps in ``root``; its requests, bytes on disk and timeline
    parts."""
    names = ["driver", *(f"agent_loop_worker_{k}" for k in range(processes - 1))]
    run_clock = Clock(wall_ns=WALL_NS, monotonic_ns=50 * S)
    listed: list[TimelineFile] = []
    total = 0
    for p, (name, mine) in enumerate(zip(names, plan(steps, processes, requests, 0), strict=True)):
        # Each process's own anchor: its monotonic clock started elsewhere.
        clock = Clock(wall_ns=WALL_NS + p * 1_000_000, monotonic_ns=(1_000 + 37 * p) * S)
        shift = clock.monotonic_ns - (clock.wall_ns - WALL_NS)
        writer = ChromeTraceWriter(
            root / "timeline" / part_name(name, 1),
            root=root,
            process=name,
            clock=clock,
            pid=1000 + p,
            tid=1000 + p,
            pause_s=0,
        )
        batch: list[Event] = []
        writes = WRITE_EVERY
        for event in sorted(mine, key=_end):  # recorded when they end
            if _step(event) > writes:  # a flush, as a live run writes at its flushes
                writer.add(batch)  # empties the batch
                writer.write(0)
                writes += WRITE_EVERY
            batch.append(_shifted(event, shift))
        writer.add(batch)
        writer.write(0)
        for written in [*writer.parts, writer.written]:
            path = f"timeline/{part_name(name, written.part)}"
            listed.append(
                TimelineFile(
                    path=path,
                    process=name,
                    bytes=written.bytes,
                    events=written.events,
                    dropped=written.dropped,
                    recorder=aprof.timeline_backend(),
                    host="bench",
                )
            )
            total += written.bytes
    run_id = "bench-report"
    (root / STEPS_FOLDER).mkdir()
    for n in profiled(steps):
        window = WindowRecord(step=n, target="trainer", kind="role", tool="torch", state="done")
        step_file = StepFile(run_id=run_id, step=n, windows=[window])
        text = step_file.model_dump_json(by_alias=True)
        (root / STEPS_FOLDER / f"step_{n}.json").write_text(text)
    run = RunFile(
        run_id=run_id,
        clock=run_clock,
        save_path=str(root),
        timeline=listed,
        config={"global_profiler": {"steps": [], "save_path": str(root)}},
    )
    (root / FILENAME).write_text(run.model_dump_json(by_alias=True, indent=1))
    return steps * processes * requests, total, len(listed)


def _end(event: Event) -> int:
    return int(event[3] if event[0] == SPAN else event[2])


def _step(event: Event) -> int:
    return int(event[5] if event[0] == REQUEST else event[4] if event[0] == SPAN else event[3])


def _shifted(event: Event, shift: int) -> Event:
    """``event`` with its times on the process's monotonic clock."""
    if event[0] == REQUEST:
        return (event[0], event[1] + shift, event[2] + shift, *event[3:])
    if event[0] == SPAN:
        return (event[0], event[1], event[2] + shift, event[3] + shift, *event[4:])
    return (event[0], event[1] + shift, event[2] + shift, *event[3:])


_MEASURE = """
import gc, json, resource, sys, time, tracemalloc
from aprof._accounting import summary
from aprof._report import accounting, collect
root, trace, what = sys.argv[1], sys.argv[2] == "trace", sys.argv[3]


def rss_peak():
    # This process's own peak (VmHWM): Linux's ru_maxrss keeps, across fork and exec, the
    # peak of the parent that spawned it (here, holding the synthesized run's events).
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


gc.collect()
if trace:
    tracemalloc.start()
began = time.perf_counter()
report = collect(root) if what == "collect" else accounting(root)
seconds = time.perf_counter() - began
peak = tracemalloc.get_traced_memory()[1] if trace else 0
tracemalloc.stop()
print(json.dumps({
    "seconds": seconds,
    "traced_peak": peak,
    "rss_peak": rss_peak(),
    "problems": list(report.problems),
    "notes": list(report.notes),
    "accounts": len(report.accounts),
    "requests": sum(a.requests for a in report.accounts),
    "run_wide": (
        report.latency_unprofiled.count + report.latency_profiled.count
        if what == "collect"
        else sum(a.requests for a in report.accounts)
    ),
    "detail": sum(
        s.latency_captured.count + s.latency_uncaptured.count
        for s in (report.steps if what == "collect" else ())
    ),
    "anomalies": len(summary(report.accounts)["anomalies"]),
}))
"""


def measure(root: Path, trace: bool, what: str = "collect") -> dict[str, Any]:
    """One ``collect(root)`` (or ``accounting(root)``) in a fresh process: its seconds, peaks
    and what it read."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(root), "trace" if trace else "time", what],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"the report failed:\n{done.stderr}")
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@dataclass
class Row:
    steps: int
    requests: int
    on_disk: int
    parts: int
    seconds: float
    rss: int
    traced: int | None
    accounting_s: float
    accounting_rss: int
    json_s: float
    json_rss: int


def run_length(tmp: Path, steps: int, args: argparse.Namespace) -> Row:
    root = tmp / f"run-{steps}"
    made = time.perf_counter()
    requests, on_disk, parts = synthesize(root, steps, args.processes, args.requests)
    made = time.perf_counter() - made
    detail = len(profiled(steps)) * args.processes * args.requests

    def checked(found: dict[str, Any]) -> dict[str, Any]:
        # The report read every step and request, else it measured nothing.
        assert not found["problems"] and found["accounts"] == steps, found
        assert found["requests"] == found["run_wide"] == requests, (found, requests)
        return found

    def best(what: str) -> dict[str, Any]:
        timed = [checked(measure(root, trace=False, what=what)) for _ in range(args.repeat)]
        return min(timed, key=lambda found: float(found["seconds"]))

    report = best("collect")
    assert report["detail"] == detail and not report["notes"], report
    traced = measure(root, trace=True) if steps <= args.trace_steps else None
    alone = best("accounting")
    # From the timeline writers' ledgers, not the JSON: the same steps and requests.
    assert not alone["notes"], alone
    aside = root / "ledgers"
    aside.mkdir()
    for ledgers in (root / "timeline").glob(f"*{LEDGER_SUFFIX}"):
        ledgers.rename(aside / ledgers.name)
    whole = best("collect")  # every timeline's JSON, as an older run's
    assert whole["detail"] == detail, whole
    print(
        f"{steps:,} steps: synthesized in {made:.1f} s ({on_disk / 2**20:.0f} MiB of gzip in "
        f"{parts} timeline parts); report {report['seconds']:.1f} s (without the ledgers "
        f"{whole['seconds']:.1f} s), accounting alone {alone['seconds']:.2f} s, "
        f"{report['anomalies']} anomalous steps; under tracemalloc "
        f"{'-' if traced is None else format(traced['seconds'], '.1f') + ' s'}",
        file=sys.stderr,
        flush=True,
    )
    shutil.rmtree(root, ignore_errors=True)
    return Row(
        steps,
        requests,
        on_disk,
        parts,
        float(report["seconds"]),
        int(report["rss_peak"]),
        None if traced is None else int(traced["traced_peak"]),
        float(alone["seconds"]),
        int(alone["rss_peak"]),
        float(whole["seconds"]),
        int(whole["rss_peak"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1000,10000", help="run lengths, comma-separated")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--requests", type=int, default=64, help="per process per step")
    parser.add_argument("--repeat", type=int, default=1, help="timed reports per run (best)")
    parser.add_argument(
        "--trace-steps",
        type=int,
        default=1_000,
        help="the longest run also reported under tracemalloc (it runs several times slower)",
    )
    args = parser.parse_args()
    lengths = [int(s) for s in args.steps.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="aprof-report-"))
    began = time.perf_counter()
    try:
        rows = [run_length(tmp, steps, args) for steps in lengths]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.perf_counter() - began
    print(
        f"`aprof._report.collect` of a synthesized run, each in a fresh process: "
        f"{args.processes} processes, {args.requests} requests per process per step, two "
        f"profiled steps; Python {platform.python_version()}, {os.cpu_count()} CPUs, load "
        f"average {os.getloadavg()[0]:.1f} at the end; {took:.0f} s in all. Seconds: best of "
        f"{args.repeat}, untraced; peak MiB: tracemalloc's peak in a traced report of its own; "
        "peak RSS: the untraced one's, Python and aprof included\n"
    )
    first = rows[0]

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.2f}x"

    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**20:,.0f}"

    print(
        f"| steps | requests | timeline gzip (parts) | seconds | s per 1,000 steps | peak MiB "
        f"| peak RSS MiB | time / {first.steps:,} steps "
        f"| memory / {first.steps:,} steps (tracemalloc / RSS) "
        f"| accounting alone s | its peak RSS MiB "
        f"| without the ledgers s | its peak RSS MiB | with / without |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row.steps:,} | {row.requests:,} | {row.on_disk / 2**20:.0f} MiB ({row.parts}) "
            f"| {row.seconds:.2f} | {row.seconds / row.steps * 1000:.2f} | {mib(row.traced)} "
            f"| {mib(row.rss)} | {ratio(row.seconds, first.seconds)} "
            f"| {ratio(row.traced, first.traced)} / {ratio(row.rss, first.rss)} "
            f"| {row.accounting_s:.2f} | {mib(row.accounting_rss)} "
            f"| {row.json_s:.2f} | {mib(row.json_rss)} | {ratio(row.seconds, row.json_s)} |"
        )


if __name__ == "__main__":
    main()
