"""The `aprof` command line: one subcommand per module, one clear line on bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from aprof.cli import demo, validate


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every `aprof` subcommand."""
    parser = argparse.ArgumentParser(
        prog="aprof",
        description="Asyncio-native profiling runtime for LLM agent loops and async RL training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (demo, validate):
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `aprof` subcommand and return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        print("aprof: interrupted", file=sys.stderr)
        return 130
    return code
