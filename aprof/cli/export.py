"""``aprof export``: a run's data for other tools.

``aprof export otlp SAVE_PATH --endpoint URL``: send the run's steps, requests, turns, tool
calls, stages and capture windows, read back from its timelines, as OTLP spans over HTTP
(protobuf) to URL (a base URL such as http://127.0.0.1:4318, or one ending in /v1/traces),
with the OpenTelemetry SDK's exporter: each step one trace, its requests with the span ids
their trace context carried, so the servers' own spans join them (Jaeger, Tempo, a
collector). Needs `pip install 'aprof[otel]'`.

``aprof export hta SAVE_PATH --step N --role ROLE [--stage S] [--out DIR]``: a folder Holistic
Trace Analysis reads as it is (``TraceAnalysis(trace_dir=DIR)``): one torch trace per rank of
ROLE in step N, linked (or copied), each naming its rank, nothing else in it (default
SAVE_PATH/hta/step_<n>/<role>).

Exits 1 with one line when SAVE_PATH holds no run, the endpoint is not an http(s) URL or
does not take the spans within --timeout (each batch: connect, send, answer), or the step,
role or stage has no trace to export. No line shows the endpoint's user or password.

examples:
  aprof export otlp outputs/profile --endpoint http://127.0.0.1:4318 --steps 1-2
  aprof export hta outputs/profile --step 2 --role actor
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aprof import ManifestError, StepSelection
from aprof._merge import export_hta
from aprof._otel import export_run
from aprof.cli import SUBCOMMANDS


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof export``."""
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    otlp = _kind(
        kinds, "otlp", "aprof export otlp outputs/profile --endpoint http://127.0.0.1:4318"
    )
    otlp.add_argument("save_path", metavar="SAVE_PATH", help="a profiled run's save_path")
    otlp.add_argument("--endpoint", required=True, metavar="URL", help="the OTLP/HTTP endpoint")
    otlp.add_argument("--steps", help="steps to send, e.g. 1,3 or 2-4 (default all)")
    otlp.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="the most one batch may take: connect, send, answer, retries (default 10 s)",
    )
    hta = _kind(kinds, "hta", "aprof export hta outputs/profile --step 2 --role actor")
    hta.add_argument("save_path", metavar="SAVE_PATH", help="a profiled run's save_path")
    hta.add_argument("--step", type=int, required=True, metavar="N", help="the step")
    hta.add_argument("--role", required=True, help="the role whose ranks' traces go")
    hta.add_argument("--stage", help="the stage, where the role captured stage by stage")
    hta.add_argument("--out", type=Path, metavar="DIR", help="the folder (default below SAVE_PATH)")


def _kind(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser], name: str, example: str
) -> argparse.ArgumentParser:
    """The parser of ``aprof export <name>``: its line of SUBCOMMANDS, and ``example``."""
    summary = SUBCOMMANDS[f"export {name}"]
    return kinds.add_parser(
        name,
        help=summary,
        description=f"{summary}.\n\nexample:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def run(args: argparse.Namespace) -> int:
    """Export, print what went where; 0, or 1 with one line on bad input."""
    if args.kind == "hta":
        return _hta(args)
    try:
        steps = None if args.steps is None else StepSelection.parse(args.steps, key="--steps")
        exported = export_run(args.save_path, args.endpoint, steps=steps, timeout_s=args.timeout)
    except (ManifestError, ValueError, OSError, ImportError, ConnectionError) as exc:
        print(f"aprof export: {exc}".replace("\n", "\\n"), file=sys.stderr)
        return 1
    print(f"{exported.sent} spans sent to {exported.endpoint}")
    for problem in exported.problems:
        print(f"  not sent: {problem}")
    return 0


def _hta(args: argparse.Namespace) -> int:
    try:
        folder, traces = export_hta(
            args.save_path, args.step, args.role, out=args.out, stage=args.stage
        )
    except (ValueError, OSError) as exc:
        print(f"aprof export: {exc}".replace("\n", "\\n"), file=sys.stderr)
        return 1
    print(f"{folder}: {len(traces)} ranks ({', '.join(map(str, traces))}) for HTA's trace_dir")
    return 0
