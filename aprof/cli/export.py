"""``aprof export otlp SAVE_PATH --endpoint URL``: a run's own spans to an OpenTelemetry backend.

Send the run's steps, requests, turns, tool calls, stages and capture windows, read back from
its timelines, as OTLP spans over HTTP (protobuf) to URL (a base URL such as
http://127.0.0.1:4318, or one ending in /v1/traces), with the OpenTelemetry SDK's exporter:
each step one trace, its requests with the span ids their trace context carried, so the
servers' own spans join them (Jaeger, Tempo, a collector). Needs `pip install 'aprof[otel]'`.
Exits 1 with one line when SAVE_PATH holds no run or the endpoint does not take the spans.
"""

from __future__ import annotations

import argparse
import sys

from aprof import ManifestError, StepSelection
from aprof._otel import export_run


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof export``."""
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    otlp = kinds.add_parser("otlp", help="the run's spans to an OTLP/HTTP endpoint")
    otlp.add_argument("save_path", metavar="SAVE_PATH", help="a profiled run's save_path")
    otlp.add_argument("--endpoint", required=True, metavar="URL", help="the OTLP/HTTP endpoint")
    otlp.add_argument("--steps", help="steps to send, e.g. 1,3 or 2-4 (default all)")
    otlp.add_argument(
        "--timeout", type=float, default=10.0, metavar="S", help="per batch (default 10 s)"
    )


def run(args: argparse.Namespace) -> int:
    """Export, print how many spans went; 0, or 1 with one line on bad input."""
    try:
        steps = None if args.steps is None else StepSelection.parse(args.steps, key="--steps")
        sent, problems = export_run(
            args.save_path, args.endpoint, steps=steps, timeout_s=args.timeout
        )
    except (ManifestError, ValueError, OSError, ImportError, ConnectionError) as exc:
        print(f"aprof export: {exc}".replace("\n", "\\n"), file=sys.stderr)
        return 1
    print(f"{sent} spans sent to {args.endpoint}")
    for problem in problems:
        print(f"  not sent: {problem}")
    return 0
