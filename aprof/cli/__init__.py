"""The `aprof` command line: one subcommand per module, one clear line on bad input.

A subcommand is a line of ``SUBCOMMANDS`` (its name and one-line help) and a module
``aprof.cli.<name>`` (dashes as underscores) whose docstring is its ``--help`` description and
which defines ``arguments(parser)`` (its options) and ``run(args) -> int`` (its exit code).
The docstring ends with an ``examples:`` block of command lines that parse (a test parses them).
A line of ``SUBCOMMANDS`` whose name has a space, ``export hta``, is a kind of a subcommand: its
module adds it with the line as help, and ``aprof --help`` lists it below the subcommands.
Only the chosen subcommand's module is imported: ``aprof validate`` loads neither the servers
nor the agent loops, and ``aprof --help`` loads no subcommand at all. Modules of ``aprof.cli``
whose names start with ``_`` are helpers, not subcommands.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

SUBCOMMANDS: dict[str, str] = {
    "capture": "have a live run capture steps now, on demand",
    "collect": "bring a run's files home from its Ray cluster's nodes",
    "demo": "run a small profiled async RL loop, show what it captured",
    "export": "a run's data for other tools (KIND: otlp, hta)",
    "export otlp": "a run's spans to an OpenTelemetry (OTLP/HTTP) endpoint",
    "export hta": "a step's rank traces as Holistic Trace Analysis reads them",
    "launch-args": "the env and args that launch a server ready for profiling",
    "merge": "each profiled step's traces as one trace on one clock",
    "npu-analyse": "parse raw Ascend captures (analysis: false) offline",
    "report": "what a run captured, step by step, problems first",
    "serve-reference": "run the embedded reference inference server",
    "status": "a run seen from outside: alive or ended, step, windows",
    "validate": "check a config file and print it fully resolved",
}
"""Every subcommand (and kind of one) and the line ``aprof --help`` shows for it."""


class Subcommand(Protocol):
    """What the module of a subcommand defines (its docstring is the ``--help`` description)."""

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's positional arguments and options to ``parser``."""

    def run(self, args: argparse.Namespace) -> int:
        """Do what the parsed ``args`` say; the process's exit code."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, not usage text plus a line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _load(name: str) -> Subcommand:
    """The module of subcommand ``name`` (a key of ``SUBCOMMANDS``), imported now."""
    return cast(Subcommand, importlib.import_module(f"aprof.cli.{name.replace('-', '_')}"))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `aprof` parser: every subcommand's name and help, and the options of ``command``.

    Only ``command``'s module is imported; the other subcommands' parsers stay empty, which is
    all ``aprof --help`` needs.
    """
    kinds = {name: summary for name, summary in SUBCOMMANDS.items() if " " in name}
    parser = _Parser(
        prog="aprof",
        description="Asyncio-native profiling runtime for LLM agent loops and async RL training.",
        epilog="kinds:\n"
        + "".join(f"  {name:<17}{summary}\n" for name, summary in kinds.items())
        + "\n'aprof COMMAND --help' shows a command's options and examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for name, summary in SUBCOMMANDS.items():
        if name in kinds:
            continue
        if name != command:
            sub.add_parser(name, help=summary)
            continue
        module = _load(name)
        chosen = sub.add_parser(
            name,
            help=summary,
            description=(module.__doc__ or summary).replace("``", ""),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.arguments(chosen)
        chosen.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `aprof` subcommand and return its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # `aprof` itself has no option but --help: its first other argument names the subcommand.
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        print("aprof: interrupted", file=sys.stderr)
        return 130
    return code
