"""The `aprof` command line: one subcommand per module, one clear line on bad input.

A subcommand is a line of ``SUBCOMMANDS`` (its name and one-line help) and a module
``aprof.cli.<name>`` (dashes as underscores) whose docstring is its ``--help`` description and
which defines ``arguments(parser)`` (its options) and ``run(args) -> int`` (its exit code).
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
    "capture": "have a live run capture its next steps (or given ones) on demand",
    "collect": "bring a run's files home from the other nodes of its Ray cluster",
    "demo": "run a small profiled async RL loop and show what was captured",
    "export": "send a run elsewhere: its spans to an OpenTelemetry (OTLP) endpoint",
    "launch-args": "print the env and args that launch a server ready for profiling",
    "merge": "merge each profiled step's timelines and traces into one trace on one clock",
    "npu-analyse": "parse raw *_ascend_pt captures (analysis: false) into readable results",
    "report": "what a run captured, step by step, problems first (and report.html)",
    "serve-reference": "run the embedded reference inference server (vLLM or SGLang dialect)",
    "status": "a run seen from outside: alive or ended, its step, windows, plans and triggers",
    "validate": "check a config file and print the resolved config",
}
"""Every subcommand's name and the help ``aprof --help`` shows for it."""


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
    parser = _Parser(
        prog="aprof",
        description="Asyncio-native profiling runtime for LLM agent loops and async RL training.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for name, summary in SUBCOMMANDS.items():
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
