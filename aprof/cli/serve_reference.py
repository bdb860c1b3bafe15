"""``aprof serve-reference``: run the embedded reference server until SIGINT or SIGTERM.

Serve a tiny real model with continuous batching and the profiling routes of vLLM (per version)
or SGLang, until SIGINT or SIGTERM.

examples:
  aprof serve-reference --port 8000 --profiler-dir traces
  aprof serve-reference --dialect sglang --port 30000
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from pydantic import ValidationError

from aprof import configure_logging
from servers.reference import Faults, ReferenceConfig, serve

_FLAGS = {
    "vllm_version": "--vllm-version",
    "profiler_dir": "--profiler-dir",
    "launch_delay_iterations": "--launch-delay-iterations",
    "launch_max_iterations": "--launch-max-iterations",
    "api_key": "--api-key",
    "model_name": "--model-name",
    "start_delay_s": "--start-delay",
    "stop_delay_s": "--stop-delay",
    "fail_routes": "--fail-route",
    "crash_on": "--crash-on",
}


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof serve-reference``."""
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port, 0 = a free one (default 8000)"
    )
    parser.add_argument("--dialect", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--vllm-version", default="0.32.0", help="vLLM release imitated (X.Y[.Z])")
    parser.add_argument(
        "--profiler-dir",
        type=Path,
        help="vLLM: trace directory (required unless --no-profiling); SGLang: default output_dir",
    )
    parser.add_argument(
        "--no-profiling",
        action="store_true",
        help="vLLM: launch without profiling (the profile routes answer 404)",
    )
    parser.add_argument(
        "--api-key", help="require 'Authorization: Bearer KEY' where the real server does"
    )
    parser.add_argument("--model-name", default="reference", help="served model name")
    parser.add_argument("--seed", type=int, default=0, help="model weight seed")
    parser.add_argument(
        "--launch-delay-iterations",
        type=int,
        default=0,
        metavar="N",
        help="vLLM >= 0.12: launch-time delay_iterations",
    )
    parser.add_argument(
        "--launch-max-iterations",
        type=int,
        default=0,
        metavar="N",
        help="vLLM >= 0.12: launch-time max_iterations (0 = unlimited)",
    )
    faults = parser.add_argument_group("fault injection")
    faults.add_argument(
        "--start-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="delay every /start_profile",
    )
    faults.add_argument(
        "--stop-delay", type=float, default=0.0, metavar="SECONDS", help="delay every /stop_profile"
    )
    faults.add_argument("--hang-stop", action="store_true", help="/stop_profile never answers")
    faults.add_argument(
        "--fail-route",
        action="append",
        default=[],
        metavar="PATH",
        help="answer 500 on PATH (repeatable)",
    )
    faults.add_argument(
        "--crash-on",
        action="append",
        default=[],
        metavar="PATH",
        help="exit the process with status 1 on a request to PATH (repeatable)",
    )
    parser.add_argument("--log-format", choices=("console", "json"), default="console")
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info"
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM and return 0; one line on stderr and 1 on bad input."""
    try:
        cfg = ReferenceConfig(
            dialect=args.dialect,
            vllm_version=args.vllm_version,
            profiling=not args.no_profiling,
            profiler_dir=args.profiler_dir,
            launch_delay_iterations=args.launch_delay_iterations,
            launch_max_iterations=args.launch_max_iterations,
            api_key=args.api_key,
            model_name=args.model_name,
            seed=args.seed,
            faults=Faults(
                start_delay_s=args.start_delay,
                stop_delay_s=args.stop_delay,
                hang_stop=args.hang_stop,
                fail_routes=frozenset(args.fail_route),
                crash_on=frozenset(args.crash_on),
            ),
        )
    except ValidationError as exc:
        print(f"aprof serve-reference: {_one_line(exc)}", file=sys.stderr)
        return 1
    if not 0 <= args.port <= 65535:
        print(f"aprof serve-reference: --port must be 0-65535, got {args.port}", file=sys.stderr)
        return 1
    configure_logging(format=args.log_format, level=args.log_level)
    try:
        asyncio.run(_serve(cfg, args.host, args.port))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(
            f"aprof serve-reference: cannot serve on {args.host}:{args.port}: {reason}",
            file=sys.stderr,
        )
        return 1
    return 0


async def _serve(cfg: ReferenceConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with serve(cfg, host=host, port=port):
        await stop.wait()


def _one_line(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
        where = _FLAGS.get(where, where)
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts).replace("\n", " ")
