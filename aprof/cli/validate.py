"""``aprof validate CONFIG``: check a config file and print it fully resolved.

Validate an aprof config file (YAML or JSON) and print it with every default filled in, after a
comment line naming the timeline recorder this install runs. Exits 1 with one line naming the
key and the reason on bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from aprof import (
    ConfigError,
    ProfilerConfig,
    from_verl,
    load_config,
    read_config_file,
    timeline_backend,
)


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
    try:
        config = _load(Path(args.config), verl=args.verl)
    except ConfigError as exc:
        # One line, whatever a key or value holds.
        message = str(exc).replace("\r", "\\r").replace("\n", "\\n")
        print(f"aprof validate: {message}", file=sys.stderr)
        return 1
    # A YAML comment: the output stays a config that loads.
    sys.stdout.write(f"# timeline: {timeline_backend()} recorder\n{config.to_yaml()}")
    return 0


def _load(path: Path, *, verl: bool) -> ProfilerConfig:
    if not verl:
        return load_config(path)
    data = read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(str(path), "a verl config must be a mapping at the top level")
    return from_verl(data)
