"""``aprof validate CONFIG``: check a config file and print it fully resolved.

Validate an aprof config file (YAML or JSON) and print it with every default filled in, after a
comment line naming the timeline recorder this install runs. With --verl, CONFIG is a verl
trainer config: its plan's warnings go to stderr (`warning: ` lines) and its verl overrides are
printed as comment lines. Exits 1 with one line naming the key and the reason on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aprof import ConfigError, load_config, timeline_backend
from aprof.verl import VerlPlan, load


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof validate``."""
    parser.add_argument("config", metavar="CONFIG", help="config file (.yaml, .yml or .json)")
    parser.add_argument(
        "--verl",
        action="store_true",
        help="read CONFIG as a verl trainer config and print the aprof config it maps to",
    )


def run(args: argparse.Namespace) -> int:
    """Print the resolved config and return 0, or print one error line and return 1."""
    plan: VerlPlan | None = None
    try:
        if args.verl:
            plan = load(Path(args.config))
        config = plan.config if plan is not None else load_config(Path(args.config))
    except ConfigError as exc:
        # One line, whatever a key or value holds.
        print(f"aprof validate: {one_line(str(exc))}", file=sys.stderr)
        return 1
    # YAML comments: the output stays a config that loads.
    sys.stdout.write(f"# timeline: {timeline_backend()} recorder\n")
    if plan is not None:
        sys.stdout.write(verl_notes(plan))
    sys.stdout.write(config.to_yaml())
    return 0


def one_line(text: str) -> str:
    """`text` with its line breaks escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def verl_notes(plan: VerlPlan) -> str:
    """The plan's warnings, on stderr now; its overrides as comment lines to print."""
    for warning in plan.warnings:
        print(f"warning: {one_line(warning)}", file=sys.stderr)
    lines = ["# verl overrides (add to the trainer's command line; only aprof profiles then):"]
    lines += [f"#   {one_line(override)}" for override in plan.overrides]
    return "\n".join(lines) + "\n"
