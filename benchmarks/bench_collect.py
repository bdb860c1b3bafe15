"""What bringing a run's files home over Ray costs, and how well a host's clock is measured.

On a real two-node Ray cluster on this machine (``examples/ray_cluster.py``: the worker node's
raylet in a mount namespace of its own, its wall clock 2.5 s ahead), a run's ``save_path`` on
the worker node holds one file of 100 MB, then 1 GB (``--sizes``), of incompressible bytes.
``aprof collect`` brings it home in a fresh process (its wall time and peak RSS); side by
side, a plain copy of the same file out of the node's namespace (``nsenter ... cat``, one pipe,
no checksum). Then 50 bursts of clock probes of the node: each burst's offset against the
2.5 s injected, and its uncertainty.

Needs Linux, root, ``unshare`` and libfaketime (``pip install libfaketime``).
Run with ``nox -s bench`` (or ``python benchmarks/bench_collect.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import ray

import aprof

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from ray_cluster import Node, on_node, start_cluster, unmet_requirement  # noqa: E402

from aprof.ray._clocks import burst  # noqa: E402
from aprof.ray._nodes import Nodes  # noqa: E402

SKEW_MS = 2500.0
BURSTS = 50
_PIECE = 1 << 20


def write_file(path: str, size: int) -> None:
    """On the node: ``size`` incompressible bytes at ``path``."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    piece = os.urandom(_PIECE)
    with open(path, "wb") as out:
        for _ in range(size // _PIECE):
            out.write(piece)


def empty_run(save_path: Path) -> None:
    """A run with no step at ``save_path``: its manifest names it."""

    async def run() -> None:
        async with aprof.Profiler({"global_profiler": {"save_path": str(save_path)}}):
            pass

    asyncio.run(run())


def timed(command: list[str], stdout: int | None = None) -> tuple[float, float]:
    """Run ``command``; its wall time (s) and peak RSS (MB)."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, stdout=stdout or subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{command[:4]} failed: {proc.stderr.read() if proc.stderr else ''}")
    return seconds, usage.ru_maxrss / 1024


def collect_row(folder: Path, node: Node, address: str, size_mb: int) -> str:
    save_path = folder / f"run-{size_mb}"
    empty_run(save_path)
    path = save_path / "timeline" / "big.bin"
    on_node(node, write_file, str(path), size_mb * _PIECE, timeout_s=600)
    command = [sys.executable, "-m", "aprof", "collect", str(save_path), "--address", address]
    seconds, rss = timed(command)
    assert path.stat().st_size == size_mb * _PIECE
    copy = folder / f"copy-{size_mb}.bin"
    namespace = f"/proc/{node.pids()[0]}/ns/mnt"
    with copy.open("wb") as out:
        plain = ["nsenter", f"--mount={namespace}", "cat", str(path)]
        copy_s, _ = timed(plain, out.fileno())
    assert copy.stat().st_size == size_mb * _PIECE
    copy.unlink()
    mb = size_mb * _PIECE / 1e6
    return (
        f"| {size_mb} MB | {mb / seconds:.0f} MB/s | {rss:.0f} MB | "
        f"{mb / copy_s:.0f} MB/s | {copy_s / seconds:.2f} |"
    )


def clock_row(folder: Path, node: Node) -> str:
    nodes = Nodes(str(folder), "bench", 30.0)
    nodes.refresh()
    (placed,) = [n for n in nodes.nodes.values() if n.node_id == node.node_id]
    errors, uncertainties = [], []
    for _ in range(BURSTS):
        best = min(burst(partial(nodes.call, placed, "now_ns")), key=lambda p: p.round_trip_ns)
        errors.append(abs(best.offset_ns + round(SKEW_MS * 1e6)) / 1e6)
        uncertainties.append(best.round_trip_ns / 2e6)
    nodes.close()
    errors.sort()
    p95 = errors[int(0.95 * BURSTS) - 1]
    return (
        f"| {BURSTS} | {statistics.median(errors):.3f} ms | {p95:.3f} ms "
        f"| {errors[-1]:.3f} ms | {statistics.median(uncertainties):.3f} ms |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="file sizes in MB (default 100,1000)")
    args = parser.parse_args()
    reason = unmet_requirement()
    if reason is not None:
        print(f"bench_collect: skipped: {reason}")
        return 0
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(prefix="bench-collect-", dir="/var/tmp") as scratch:
        folder = Path(scratch) / "runs"
        with start_cluster(folder, [0.0, SKEW_MS], Path(scratch) / "logs") as cluster:
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                node = cluster.nodes[1]
                rows = [
                    collect_row(folder, node, cluster.address, int(size))
                    for size in args.sizes.split(",")
                ]
                clock = clock_row(folder, node)
            finally:
                ray.shutdown()
    print("| node file | aprof collect | its peak RSS | plain copy (nsenter cat) | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("| bursts | offset error p50 | p95 | max | uncertainty p50 |")
    print("|---|---|---|---|---|")
    print(clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
