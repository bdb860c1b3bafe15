"""``aprof merge SAVE_PATH``: each profiled step of a run as one trace on one clock.

Merge each profiled step's timelines (the driver's and every agent-loop process's) and its
windows' Chrome JSON traces (the servers' workers and frontends, the trainer ranks) into
SAVE_PATH/merged/step_<n>.trace.json.gz (or --out DIR), placed by wall clock, each process
named by its target, and beside it the same files untouched in a Perfetto trace archive
(step_<n>.perfetto.tar, with a perfetto_manifest.json placing each on the driver's timeline).
Open either in https://ui.perfetto.dev (the merged trace also in chrome://tracing). Each input
is read event by event, whatever its size; --jobs processes (this one and workers) read a
step's captures at once. An input that cannot be merged (missing, not JSON, on no known
clock) is named in a note and left out; one cut short is merged up to the cut, with a note.
Exits 1 with one line when SAVE_PATH holds no run or a step was not profiled.

examples:
  aprof merge outputs/profile
  aprof merge outputs/profile --steps 2-4 --out merged
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aprof import ManifestError, StepSelection, merge


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof merge``."""
    parser.add_argument("save_path", metavar="SAVE_PATH", help="a profiled run's save_path")
    parser.add_argument("--steps", help="profiled steps to merge, e.g. 1,3 or 2-4 (default all)")
    parser.add_argument("--out", type=Path, help="folder for the merged traces")
    parser.add_argument(
        "--otel",
        type=Path,
        metavar="DIR",
        help="the servers' spans also from the files a collector's file exporter wrote here",
    )
    parser.add_argument(
        "--no-clock-offsets",
        action="store_true",
        help="trust each host's wall clock: do not move its files by its measured offset",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="processes reading a step's captures at once, this one and workers (default: "
        "the cores available, for large steps; 1: no worker)",
    )


def run(args: argparse.Namespace) -> int:
    """Merge, print each merged file with its notes; 0, or 1 with one line on bad input."""
    try:
        steps = None if args.steps is None else StepSelection.parse(args.steps, key="--steps")
        merged = merge(
            args.save_path,
            steps=steps,
            out=args.out,
            otel=args.otel,
            jobs=args.jobs,
            clock_offsets=not args.no_clock_offsets,
        )
    except (ManifestError, ValueError, OSError) as exc:
        print(f"aprof merge: {exc}".replace("\n", "\\n"), file=sys.stderr)
        return 1
    for step in merged:
        others = f"; {len(step.others)} other files kept as they are" if step.others else ""
        print(
            f"step {step.step}: {step.path} "
            f"({step.events} events from {len(step.inputs)} files{others})"
        )
        if step.archive is not None:
            print(f"  as a Perfetto trace archive: {step.archive}")
        for note in step.notes:
            print(f"  note: {note}")
    return 0
