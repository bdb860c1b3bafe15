"""``aprof validate CONFIG``: check a config file and print it fully resolved.

Validate an aprof config file (YAML or JSON) and print it with every default filled in, after a
comment line naming the timeline recorder this install runs.

With --verl, CONFIG is a verl trainer config. When it holds an `aprof` block (aprof's config
inside verl's, as `aprof launch-args --verl` writes it), that block is checked as verl's
trainer checks it at launch (save_path absolute, verl's own profiler off, verl's rollout
profiler on when aprof profiles the rollout) and printed. Otherwise the config aprof makes of
verl's profiler settings is printed, its warnings on stderr (`warning: ` lines) and the verl
overrides that turn aprof on as comment lines, each quoted for the shell.

Exits 1 with one line naming the key and the reason on bad input.

examples:
  aprof validate profile.yaml
  aprof validate --verl job.yaml
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from aprof import ConfigError, ProfilerConfig, load_config, timeline_backend
from aprof.verl import VerlPlan, aprof_config, load


def arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``aprof validate``."""
    parser.add_argument("config", metavar="CONFIG", help="config file (.yaml, .yml or .json)")
    parser.add_argument(
        "--verl",
        action="store_true",
        help="read CONFIG as a verl trainer config: check its aprof block, or print the aprof "
        "config its profiler settings map to",
    )


def run(args: argparse.Namespace) -> int:
    """Print the resolved config and return 0, or print one error line and return 1."""
    plan: VerlPlan | None = None
    block: ProfilerConfig | None = None
    path = Path(args.config)
    try:
        if args.verl:
            block = aprof_config(path)
            if block is None:
                plan = load(path)
        if block is not None:
            config = block
        else:
            config = plan.config if plan is not None else load_config(path)
    except ConfigError as exc:
        # One line, whatever a key or value holds.
        print(f"aprof validate: {one_line(str(exc))}", file=sys.stderr)
        return 1
    # YAML comments: the output stays a config that loads.
    sys.stdout.write(f"# timeline: {timeline_backend()} recorder\n")
    if block is not None:
        sys.stdout.write("# the verl config's aprof block (checked as verl's trainer does)\n")
    if plan is not None:
        verl_warnings(plan)
        sys.stdout.write(verl_notes(plan))
    sys.stdout.write(config.to_yaml())
    return 0


def one_line(text: str) -> str:
    """`text` with its line breaks escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def verl_warnings(plan: VerlPlan) -> None:
    """The plan's warnings, on stderr."""
    for warning in plan.warnings:
        print(f"warning: {one_line(warning)}", file=sys.stderr)


def verl_notes(plan: VerlPlan) -> str:
    """The plan's overrides as comment lines, each quoted for the shell."""
    lines = ["# verl overrides (add to main_ppo's command line; only aprof profiles then):"]
    lines += [f"#   {one_line(shlex.quote(override))}" for override in plan.overrides]
    return "\n".join(lines) + "\n"
