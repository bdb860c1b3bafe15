"""``aprof launch-args``: the environment and arguments that enable profiling on a server.

Print, shell-ready, what a server launch needs so that aprof can profile it as CONFIG says:
`export K=V` lines, then the arguments to append to the server's command line (or, with
--command, the whole command). Lines starting with '#' name settings this engine and version
cannot apply. With --verl, CONFIG is a verl trainer config: its plan's warnings go to stderr
(`warning: ` lines) and its verl overrides are printed as comment lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aprof import ConfigError
from aprof.cli.validate import one_line, verl_notes
from aprof.verl import VerlPlan, load
from servers import launch_spec
from servers.launch import ENGINES


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof launch-args``."""
    parser.add_argument("config", metavar="CONFIG", nargs="?", help="aprof config file")
    parser.add_argument("--verl", action="store_true", help="read CONFIG as a verl trainer config")
    parser.add_argument("--engine", required=True, choices=ENGINES, help="server kind")
    parser.add_argument("--version", required=True, help="engine version, e.g. 0.12.0")
    parser.add_argument(
        "--profiler-dir", type=Path, help="trace folder (default <save_path>/server_traces)"
    )
    parser.add_argument(
        "--dialect", choices=("vllm", "sglang"), default="vllm", help="reference server dialect"
    )
    parser.add_argument("--no-profiling", action="store_true", help="a launch without profiling")
    parser.add_argument("--command", action="store_true", help="print the whole command line")
    parser.add_argument("--model", help="model path or name (completes the command)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: the engine's)")
    parser.add_argument(
        "--otel-endpoint",
        metavar="URL",
        help="aprof's OTLP receiver (default with otel.receive: http://<otel.host>:<otel.port>)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the launch settings and return 0, or print one error line and return 1."""
    plan: VerlPlan | None = None
    try:
        if args.verl:
            if args.config is None:
                raise ValueError("--verl needs CONFIG, the verl trainer config")
            plan = load(args.config)
        spec = launch_spec(
            args.engine,
            plan.config if plan is not None else args.config,
            version=args.version,
            profiler_dir=args.profiler_dir,
            profiling=not args.no_profiling,
            model=args.model,
            host=args.host,
            port=args.port,
            dialect=args.dialect,
            otel_endpoint=args.otel_endpoint,
        )
        if args.command and not spec.command:
            raise ValueError(f"--command needs --model for engine {args.engine}")
    except (ConfigError, ValueError) as exc:
        print(f"aprof launch-args: {one_line(str(exc))}", file=sys.stderr)
        return 1
    if plan is not None:
        sys.stdout.write(verl_notes(plan))
    sys.stdout.write(spec.shell(command=args.command))
    return 0
