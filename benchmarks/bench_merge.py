"""What ``aprof merge`` and ``aprof report`` cost at real GPU trace sizes: throughput and peak
memory for steps of 100 MB, 1 GB and 5 GB of JSON in five traces, and of one 3 GB trace
(``--sizes``), today's reader side by side with the whole-file one it replaced.

Each size is a real run folder (an ``aprof.Profiler`` with ``--files`` trainer-rank role
targets, one profiled step) whose capture files are then replaced by synthetic Kineto-shaped
traces, gzip as torch writes them: torch's indented layout, many small ``X`` events of
``cpu_op``s with torch's ``args``, one in a thousand with a large ``args`` (a Python stack),
flow events, and the process and thread names after the events. Each reader runs in a fresh
subprocess per size, which reports its wall time and peak RSS (its own and any worker
processes'); a subprocess that only imports aprof gives the baseline.

"Whole-file" is aprof as of ``--before`` (default: the commit before the streaming reader),
unpacked from git into a temporary folder and run from there; it is skipped for a step whose
largest input it could not hold in ``--whole-limit`` MB of JSON (it holds about 10 bytes per
byte of the largest input).

Run with ``nox -s bench`` (or ``python benchmarks/bench_merge.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import aprof
from aprof.testing import RecordingTarget

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "24f2039"
"""The last commit whose merge and report read each input whole."""
_MEASURE = """
import resource, sys, time
import aprof
began = time.perf_counter()
if sys.argv[1] == "merge":
    (step,) = aprof.merge(sys.argv[2], steps=[1], out=sys.argv[3])
    assert not step.notes, step.notes
elif sys.argv[1] == "report":
    from aprof._report import collect
    report = collect(sys.argv[2])
    assert not [p for s in report.steps for p in s.problems if "unreadable" in p], report
seconds = time.perf_counter() - began
who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)  # its own and any worker's
rss = max(resource.getrusage(w).ru_maxrss for w in who)
print(seconds, rss)
"""
_BASE_NS = 1_790_000_000_000_000_000
_EVENT = """
  {{
    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4243,
    "ts": {ts:.3f}, "dur": 12.500,
    "args": {{
      "External id": {i},"Record function id": 0, "Sequence number": {i},
      "Fwd thread id": 0, "Ev Idx": {i}
    }}
  }}"""
_STACK = "".join(f"torch/nn/modules/module.py({n}): _call_impl\\n" for n in range(200))
_LARGE = """
  {{
    "ph": "X", "cat": "python_function", "name": "forward", "pid": 4242, "tid": 4243,
    "ts": {ts:.3f}, "dur": 5.000,
    "args": {{
      "Python id": {i}, "Python parent id": 1, "Python stack": "{stack}"
    }}
  }}"""
_FLOW = """
  {{
    "ph": "{ph}", "id": {i}, "pid": 4242, "tid": 4243, "ts": {ts:.3f},
    "cat": "ac2g", "name": "ac2g"{bp}
  }}"""
_TAIL = """
  {
    "name": "process_name", "ph": "M", "ts": 5000000000.000, "pid": 4242, "tid": 0,
    "args": {"name": "python3"}
  },
  {
    "name": "thread_name", "ph": "M", "ts": 5000000000.000, "pid": 4242, "tid": 4243,
    "args": {"name": "thread 4243 (python3)"}
  }
],
  "traceName": "synthetic.pt.trace.json"
}"""


def kineto_trace(path: Path, size: int) -> int:
    """Write a Kineto-shaped trace of about ``size`` bytes of JSON to ``path`` (gzip); its
    JSON size."""
    written = 0
    with gzip.open(path, "wt", compresslevel=1) as out:
        head = (
            '{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {_BASE_NS},\n  "traceEvents": ['
        )
        out.write(head)
        written += len(head)
        i = 0
        while written < size:
            pieces = []
            for k in range(i, i + 1000):
                ts = 5_000_000_000.0 + k * 20.0
                if k % 1000 == 999:
                    pieces.append(_LARGE.format(ts=ts, i=k, stack=_STACK))
                elif k % 100 in (98, 99):
                    flow = "s" if k % 100 == 98 else "f"
                    bp = ', "bp": "e"' if flow == "f" else ""
                    pieces.append(_FLOW.format(ph=flow, i=k // 100, ts=ts, bp=bp))
                else:
                    pieces.append(_EVENT.format(ts=ts, i=k))
            piece = ("," if i else "") + ",".join(pieces)
            out.write(piece)
            written += len(piece)
            i += 1000
        out.write("," + _TAIL)
    return written + len(_TAIL) + 1


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


def step_of(root: Path, mb: int, files: int) -> list[int]:
    """A run with one step of ``mb`` MB of JSON in ``files`` synthetic traces; their sizes."""
    asyncio.run(profiled_run(root, files))
    manifest = aprof.load_manifest(root)
    paths = [root / f.path for w in manifest.windows for f in w.files]
    sizes = []
    for path in paths:
        target = path.with_name(path.name.removesuffix(".json") + ".pt.trace.json.gz")
        path.unlink()
        sizes.append(kineto_trace(target, mb * 1_000_000 // files))
    # The manifest names the files it was given: point it at the synthetic ones.
    listing = root / "manifest" / "step_1.json"
    text = listing.read_text()
    for path in paths:
        rel = str(path.relative_to(root))
        text = text.replace(f'"{rel}"', f'"{rel.removesuffix(".json")}.pt.trace.json.gz"')
    # The whole-file reader's aprof predates the windows' `waited_for` (null here): a key it
    # would refuse, and the new reader takes as null when absent.
    listing.write_text(text.replace('"waited_for": null,', "").replace('"waited_for":null,', ""))
    return sizes


def measure(code: Path | None, *args: str) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of one reader in a fresh process, aprof from ``code`` (a
    folder holding an ``aprof`` package; this checkout's without)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(code)
        env["APROF_NO_EXTENSIONS"] = "1"  # its C recorder is not built there; no reader uses it
    # Not from the checkout's folder: ``python -c`` puts the working folder first on its path.
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tempfile.gettempdir() if code is None else code,
    )
    seconds, rss_kib = done.stdout.split()
    return float(seconds), int(rss_kib) / 1024


def unpack(revision: str, into: Path) -> Path:
    """aprof's package as of ``revision``, unpacked into ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "aprof"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="100,1000,3000x1,5000",
        help="steps: MB of JSON in all, each in --files traces or in the count after an x",
    )
    parser.add_argument("--files", type=int, default=5, help="trace files per step")
    parser.add_argument("--before", default=BEFORE, help="the whole-file reader's revision")
    parser.add_argument(
        "--whole-limit", type=int, default=400, help="largest input (MB) the whole-file reader gets"
    )
    args = parser.parse_args()
    header = (
        "what",
        "step JSON",
        "largest",
        "reader",
        "time",
        "MB/s",
        "peak RSS",
        "RSS - baseline",
    )
    rows = [header]
    with tempfile.TemporaryDirectory() as tmp:
        before = unpack(args.before, Path(tmp) / "before")
        baselines = {
            "streaming": measure(None, "-")[1],
            "whole file": measure(before, "-")[1],
        }
        for size in args.sizes.split(","):
            mb, _, files = size.partition("x")
            root = Path(tmp) / f"run-{size}"
            sizes = step_of(root, int(mb), int(files or args.files))
            total, largest = sum(sizes) / 1e6, max(sizes) / 1e6
            for what in ("merge", "report"):
                for reader, code in (("whole file", before), ("streaming", None)):
                    if code is not None and largest > args.whole_limit:
                        needs = f"(needs ~{largest * 10 / 1024:.0f} GiB)"
                        shown = (f"{total:.0f} MB", f"{largest:.0f} MB")
                        rows.append((what, *shown, reader, "not run", "", "", needs))
                        continue
                    extra = [str(root / "merged")] if what == "merge" else []
                    seconds, rss = measure(code, what, str(root), *extra)
                    over = rss - baselines[reader]
                    rows.append(
                        (
                            what,
                            f"{total:.0f} MB",
                            f"{largest:.0f} MB",
                            reader,
                            f"{seconds:.1f} s",
                            f"{total / seconds:.1f}",
                            f"{rss:.0f} MiB",
                            f"{over:.0f} MiB",
                        )
                    )
                    print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            for trace in root.rglob("*.gz"):
                trace.unlink()  # the disk holds one step at a time
    shown = ", ".join(f"{k} {v:.0f} MiB" for k, v in baselines.items())
    print(f"aprof merge and aprof report, one step; baselines (python + import aprof): {shown}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


if __name__ == "__main__":
    main()
