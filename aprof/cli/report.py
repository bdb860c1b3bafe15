"""``aprof report SAVE_PATH``: what a profiled run captured, step by step.

Print every problem first (failed, timed-out or skipped windows, forward steps observed other
than requested, failed rank captures, unreadable traces or timelines, dropped timeline events),
then per profiled step its windows, the request latency (p50/p95/p99) of captured against
uncaptured requests, the gated requests' wait for their capture's start, the servers' iteration
times and the trainer's stage durations read from the traces, and the latency of the requests
of profiled against unprofiled steps. Also writes SAVE_PATH/report.html (not with --no-html)
and prints its path. With --json, prints only one JSON object, every step's accounting
(``aprof._report.document``), and writes nothing. Exits 1 with one line when SAVE_PATH holds
no run or report.html cannot be written.

examples:
  aprof report outputs/profile
  aprof report outputs/profile --json
"""

from __future__ import annotations

import argparse
import sys

from aprof import ManifestError
from aprof._report import accounting, collect, dumps, render, with_html


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof report``."""
    parser.add_argument("save_path", metavar="SAVE_PATH", help="a profiled run's save_path")
    parser.add_argument(
        "--no-html", action="store_true", help="print the report only; write no report.html"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print every step's accounting as one JSON object, and nothing else; write nothing",
    )


def run(args: argparse.Namespace) -> int:
    """Print the report (and write report.html); 0, or 1 with one line on bad input."""
    try:
        if args.json:  # the accounting alone: from the writers' ledgers where they cover it
            print(dumps(accounting(args.save_path)))
            return 0
        report = collect(args.save_path)
    except (ManifestError, OSError) as exc:
        return _fail(exc)
    sys.stdout.write(render(report))
    if args.no_html:
        return 0
    try:
        report = with_html(report, args.save_path)
    except OSError as exc:
        return _fail(exc)
    print(f"report: {report.html}")
    return 0


def _fail(exc: BaseException) -> int:
    print(f"aprof report: {exc}".replace("\n", "\\n"), file=sys.stderr)
    return 1
