"""``aprof collect SAVE_PATH``: bring a run's files home from the other nodes of its Ray cluster.

On a cluster without shared storage each node keeps what its processes wrote below save_path
(timelines, worker captures, server traces). Run on the driver's node once the run has ended,
while its Ray cluster is up: an agent on each other node lists its part of save_path (no link
followed) and streams each file the driver lacks into SAVE_PATH in pieces, checked against the
node's SHA-256 before it takes its name; a file already collected is not fetched again. The
run's manifest.json then lists every file with its host, size and checksum. A node that is
gone, or a file that could not be brought, is named in a note (and printed).
Exits 0 when every file came, 1 with the notes when some did not, 2 when SAVE_PATH holds no
run or Ray cannot be reached.

example:
  aprof collect outputs/profile --address 10.0.0.1:6379
"""

from __future__ import annotations

import argparse
import logging
import sys

from aprof import ManifestError


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof collect``."""
    parser.add_argument("save_path", metavar="SAVE_PATH", help="the run's save_path, on this node")
    parser.add_argument(
        "--address", default="auto", help="the Ray cluster (default: auto, the one running here)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="longest it may take (600)"
    )


def run(args: argparse.Namespace) -> int:
    """Collect, print what came and the notes; 0, 1 (some files did not come) or 2."""
    try:
        import ray

        from aprof.ray import collect
    except ImportError as exc:
        print(f"aprof collect: needs Ray: pip install 'aprof[ray]' ({exc})", file=sys.stderr)
        return 2
    try:
        ray.init(address=args.address, logging_level=logging.ERROR, log_to_driver=False)
    except Exception as exc:
        print(f"aprof collect: no Ray cluster at {args.address}: {exc}", file=sys.stderr)
        return 2
    try:
        done = collect(args.save_path, limit_s=args.timeout)
    except ManifestError as exc:
        print(f"aprof collect: {exc}", file=sys.stderr)
        return 2
    finally:
        ray.shutdown()
    hosts = len({f.host for f in done.files})
    print(
        f"fetched {done.fetched} files ({done.fetched_bytes / 1e6:.1f} MB), "
        f"{done.present} already here; {len(done.files)} files of the run on {hosts} hosts"
    )
    for note in done.notes:
        print(f"  note: {note}")
    return 1 if done.notes else 0
