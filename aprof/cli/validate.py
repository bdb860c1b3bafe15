"""``aprof validate CONFIG``: check a config file and print it fully resolved."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from aprof._config import ProfilerConfig, load_config, read_config_file
from aprof._errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``validate`` subcommand."""
    parser = sub.add_parser(
        "validate",
        help="check a config file and print the resolved config",
        description=(
            "Validate an aprof config file (YAML or JSON) and print it with every default "
            "filled in. Exits 1 with one line naming the key and the reason on bad input."
        ),
    )
    parser.add_argument("config", metavar="CONFIG", help="config file (.yaml, .yml or .json)")
    parser.add_argument(
        "--verl",
        action="store_true",
        help="read CONFIG as a verl trainer config and print the aprof config it maps to",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the resolved config and return 0, or print one error line and return 1."""
    try:
        config = _load(Path(args.config), verl=args.verl)
    except ConfigError as exc:
        # One line, whatever a key or value holds.
        message = str(exc).replace("\r", "\\r").replace("\n", "\\n")
        print(f"aprof validate: {message}", file=sys.stderr)
        return 1
    sys.stdout.write(config.to_yaml())
    return 0


def _load(path: Path, *, verl: bool) -> ProfilerConfig:
    if not verl:
        return load_config(path)
    data = read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(str(path), "a verl config must be a mapping at the top level")
    return ProfilerConfig.from_verl(data)
