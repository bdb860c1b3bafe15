"""``aprof launch-args``: what a launch needs so that aprof profiles it.

Without --verl: print, shell-ready, what a server launch needs so that aprof can profile it as
CONFIG (an aprof config) says: `export K=V` lines, then the arguments to append to the
server's command line (or, with --command, the whole command). Lines starting with '#' name
settings this engine and version cannot apply. --engine and --version are required.

With --verl: CONFIG is a verl trainer config (as verl would run without aprof); print the Hydra
overrides to add to verl's `python -m verl.trainer.main_ppo` command line, one per line, each
quoted for the shell: Ray's worker setup hook (aprof.verl.hook.install), aprof's config as
verl's `aprof` block (save_path made absolute against the current folder), verl's own
profiler off. The plan's warnings go to stderr (`warning: ` lines). verl launches its rollout
servers itself: the server options are not used then.

examples:
  aprof launch-args --engine vllm --version 0.13.0 profile.yaml
  python -m verl.trainer.main_ppo --cfg job ARGS... > job.yaml
  eval "extra=($(aprof launch-args --verl job.yaml))"
  python -m verl.trainer.main_ppo ARGS... "${extra[@]}"
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from aprof import ConfigError
from aprof.cli.validate import one_line, verl_warnings
from aprof.verl import load
from servers import launch_spec
from servers.launch import ENGINES

_SERVER_OPTIONS = (
    "engine",
    "version",
    "profiler_dir",
    "dialect",
    "no_profiling",
    "command",
    "model",
    "host",
    "port",
    "otel_endpoint",
)
"""The options of a server launch (none of which a verl launch takes), as ``args`` names them."""


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof launch-args``."""
    parser.add_argument(
        "config", metavar="CONFIG", nargs="?", help="aprof config file (--verl: verl's config)"
    )
    parser.add_argument(
        "--verl",
        action="store_true",
        help="read CONFIG as a verl trainer config; print the overrides for verl's main_ppo",
    )
    server = parser.add_argument_group("server launch (without --verl)")
    server.add_argument("--engine", choices=ENGINES, help="server kind (required)")
    server.add_argument("--version", help="engine version, e.g. 0.12.0 (required)")
    server.add_argument(
        "--profiler-dir", type=Path, help="trace folder (default <save_path>/server_traces)"
    )
    server.add_argument(
        "--dialect", choices=("vllm", "sglang"), help="reference server dialect (default vllm)"
    )
    server.add_argument("--no-profiling", action="store_true", help="a launch without profiling")
    server.add_argument("--command", action="store_true", help="print the whole command line")
    server.add_argument("--model", help="model path or name (completes the command)")
    server.add_argument("--host", help="bind address (default 127.0.0.1)")
    server.add_argument("--port", type=int, help="port (default: the engine's)")
    server.add_argument(
        "--otel-endpoint",
        metavar="URL",
        help="aprof's OTLP receiver (default with otel.receive: http://<otel.host>:<otel.port>)",
    )


def run(args: argparse.Namespace) -> int:
    """Print the launch settings and return 0, or print one error line and return 1."""
    try:
        text = _verl(args) if args.verl else _server(args)
    except (ConfigError, ValueError) as exc:
        print(f"aprof launch-args: {one_line(str(exc))}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


def _verl(args: argparse.Namespace) -> str:
    """verl's overrides, one shell word a line; the plan's warnings on stderr."""
    if args.config is None:
        raise ValueError("--verl needs CONFIG, the verl trainer config")
    given = [
        f"--{name.replace('_', '-')}"
        for name in _SERVER_OPTIONS
        if getattr(args, name) is not None and getattr(args, name) is not False
    ]
    if given:
        raise ValueError(
            f"{', '.join(given)}: not used with --verl (verl launches its rollout servers "
            "itself); leave them out"
        )
    plan = load(args.config)
    verl_warnings(plan)
    return "".join(f"{shlex.quote(override)}\n" for override in plan.overrides)


def _server(args: argparse.Namespace) -> str:
    """The server launch: exports, then its arguments (or its whole command)."""
    if args.engine is None or args.version is None:
        raise ValueError("--engine and --version are required (or --verl for a verl config)")
    spec = launch_spec(
        args.engine,
        args.config,
        version=args.version,
        profiler_dir=args.profiler_dir,
        profiling=not args.no_profiling,
        model=args.model,
        host="127.0.0.1" if args.host is None else args.host,
        port=args.port,
        dialect=args.dialect or "vllm",
        otel_endpoint=args.otel_endpoint,
    )
    if args.command and not spec.command:
        raise ValueError(f"--command needs --model for engine {args.engine}")
    return spec.shell(command=args.command)
