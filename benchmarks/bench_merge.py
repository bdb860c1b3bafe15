"""What ``aprof merge`` costs: throughput and peak memory for a step of ~10, ~100 and ~500 MB.

Each size is a real run folder (an ``aprof.Profiler`` with ``--files`` trainer-rank role
targets, one profiled step) whose capture files are then replaced by synthetic Kineto-shaped
traces (``baseTimeNanoseconds``, a process name, ``X`` slices of ``cpu_op``s with torch's
``args``), gzip-compressed as torch writes them, together holding the step's size of JSON. The
merge (the merged trace and the Perfetto archive) runs in a fresh subprocess per size, which
reports its wall time and peak RSS; a subprocess that only imports aprof gives the baseline.

Expected: time linear in the input (MB/s flat across sizes) and memory above the baseline
bounded by the largest single input, not by the step's sum.

Run with ``nox -s bench`` (or ``python benchmarks/bench_merge.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import aprof
from aprof.testing import RecordingTarget

_MEASURE = """
import resource, sys, time
import aprof
began = time.perf_counter()
if sys.argv[1] != "-":
    (step,) = aprof.merge(sys.argv[1], steps=[1], out=sys.argv[2])
    assert not step.notes, step.notes
print(time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
_BASE_NS = 1_790_000_000_000_000_000
_EVENT = (
    '{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":4242,"tid":4243,"ts":{ts:.3f},'
    '"dur":12.5,"args":{{"External id":{i},"Sequence number":{i},"Fwd thread id":0,'
    '"Record function id":0,"Ev Idx":{i}}}}}'
)


def kineto_trace(path: Path, size: int) -> int:
    """Write a Kineto-shaped trace of about ``size`` bytes of JSON to ``path`` (gzip); its
    JSON size."""
    written = 0
    with gzip.open(path, "wt", compresslevel=1) as out:
        head = (
            f'{{"schemaVersion":1,"baseTimeNanoseconds":{_BASE_NS},"traceEvents":['
            '{"ph":"M","name":"process_name","pid":4242,"tid":0,"args":{"name":"python3"}}'
        )
        out.write(head)
        written += len(head)
        i = 0
        while written < size:
            piece = "".join(
                "," + _EVENT.format(ts=5_000_000_000.0 + (i + k) * 20.0, i=i + k)
                for k in range(1000)
            )
            out.write(piece)
            written += len(piece)
            i += 1000
        out.write("]}")
    return written + 2


async def profiled_run(root: Path, files: int) -> None:
    cfg = {
        "global_profiler": {"steps": [1], "save_path": str(root)},
        "roles": {f"rank{k}": {"enable": True} for k in range(files)},
        "log": {"level": "warning"},
    }
    async with aprof.Profiler(cfg) as prof:
        for k in range(files):
            prof.add_target(RecordingTarget(f"rank{k}", kind="role"))
        async with prof.step(1):
            pass


def measure(*args: str) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of the merge in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, check=True
    )
    seconds, rss_kib = done.stdout.split()
    return float(seconds), int(rss_kib) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,500", help="step sizes in MB of JSON")
    parser.add_argument("--files", type=int, default=5, help="trace files per step")
    args = parser.parse_args()
    _, baseline = measure("-", "-")
    rows = [
        (
            "step JSON",
            "files",
            "largest",
            "gzip on disk",
            "time",
            "MB/s",
            "peak RSS",
            "RSS - baseline",
        )
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for mb in (int(s) for s in args.sizes.split(",")):
            root = Path(tmp) / f"run-{mb}"
            asyncio.run(profiled_run(root, args.files))
            manifest = aprof.load_manifest(root)
            paths = [root / f.path for w in manifest.windows for f in w.files]
            sizes = []
            for path in paths:
                target = path.with_name(path.name.removesuffix(".json") + ".pt.trace.json.gz")
                path.unlink()
                sizes.append(kineto_trace(target, mb * 1_000_000 // args.files))
            # The manifest names the files it was given: point it at the synthetic ones.
            listing = root / "manifest" / "step_1.json"
            text = listing.read_text()
            for path in paths:
                rel = str(path.relative_to(root))
                text = text.replace(
                    json.dumps(rel), json.dumps(rel.removesuffix(".json") + ".pt.trace.json.gz")
                )
            listing.write_text(text)
            on_disk = sum(p.stat().st_size for p in root.rglob("*.pt.trace.json.gz"))
            seconds, rss = measure(str(root), str(root / "merged"))
            total, largest = sum(sizes) / 1e6, max(sizes) / 1e6
            over = rss - baseline
            rows.append(
                (
                    f"{total:.0f} MB",
                    str(len(sizes)),
                    f"{largest:.0f} MB",
                    f"{on_disk / 1e6:.1f} MB",
                    f"{seconds:.1f} s",
                    f"{total / seconds:.1f}",
                    f"{rss:.0f} MiB",
                    f"{over:.0f} MiB ({over * 1.048576 / largest:.1f}x largest)",
                )
            )
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"aprof merge, one step; baseline (python + import aprof): {baseline:.0f} MiB")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
