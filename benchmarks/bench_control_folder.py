"""What one read of a flooded control folder costs the run's disk thread, beside an empty one.

``ControlFolder.take`` is timed (``--reads`` times each, median and worst, in microseconds) on
``save_path/control/requests/`` holding:

1. nothing;
2. ``--entries`` dot-files (writes under way, never moved before ``WRITE_S``): a folder that
   stays full, listed a part at a time;
3. ``--entries`` entries that cannot be moved (``control/rejected`` is a link, so each is
   found stuck once and skipped from then on);
4. ``--entries`` misnamed files, read by read as they drain into ``control/rejected/`` (each
   read moves ``SET_ASIDE_PER_BOUNDARY`` of them).

Each flooded case also holds one capture request, placed last; the table says at which read
it was taken (a read lists ``LISTED_PER_BOUNDARY`` entries, going on where the last stopped).
Run with ``python benchmarks/bench_control_folder.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aprof._control import CaptureRequest, ControlFolder


def _fill(save: Path, kind: str, n: int) -> None:
    requests = save / "control" / "requests"
    requests.mkdir(parents=True)
    if kind == "stuck":
        (save / "elsewhere").mkdir()
        (save / "control" / "rejected").symlink_to(save / "elsewhere")
    for i in range(n):
        name = f".w{i}.tmp" if kind == "writing" else f"junk {i}"
        os.close(os.open(requests / name, os.O_CREAT | os.O_WRONLY, 0o644))
    ControlFolder(save).submit(CaptureRequest(id="wanted", next=1))


def _time(save: Path, reads: int) -> tuple[list[float], int | None]:
    folder = ControlFolder(save)
    took: list[float] = []
    found = None
    for i in range(reads):
        began = time.perf_counter_ns()
        read = folder.take()
        took.append((time.perf_counter_ns() - began) / 1e3)
        if found is None and any(item.id == "wanted" for item in read.incoming):
            found = i + 1
    return took, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=30)
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[Path], None]]] = [
        ("empty", lambda save: (save / "control" / "requests").mkdir(parents=True)),
        (f"{args.entries} dot-files", lambda save: _fill(save, "writing", args.entries)),
        (f"{args.entries} stuck entries", lambda save: _fill(save, "stuck", args.entries)),
        (f"{args.entries} misnamed files", lambda save: _fill(save, "misnamed", args.entries)),
    ]
    print("| folder | median µs/read | worst µs/read | request taken at read |")
    print("|---|---:|---:|---:|")
    for label, fill in cases:
        save = Path(tempfile.mkdtemp(prefix="aprof-bench-"))
        try:
            fill(save)
            took, found = _time(save, args.reads)
        finally:
            shutil.rmtree(save)
        print(f"| {label} | {statistics.median(took):.0f} | {max(took):.0f} | {found or '-'} |")


if __name__ == "__main__":
    main()
