"""The `aprof` command line: one subcommand per module, one clear line on bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from aprof.cli import demo, launch_args, npu_analyse, serve_reference, validate


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, not usage text plus a line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every `aprof` subcommand."""
    parser = _Parser(
        prog="aprof",
        description="Asyncio-native profiling runtime for LLM agent loops and async RL training.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for command in (demo, launch_args, npu_analyse, serve_reference, validate):
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
