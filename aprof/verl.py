"""aprof for verl: read a verl trainer config as the plan of an aprof run.

``load(cfg)`` is the one entry point: it maps verl's profiler settings onto aprof's config,
says what it left out, and gives the overrides that switch verl's own profiler off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from aprof._config import ProfilerConfig, read_config_file
from aprof._errors import ConfigError
from aprof._verl import STAGES, map_verl

__all__ = ["STAGES", "VerlPlan", "load"]


@dataclass(frozen=True)
class VerlPlan:
    """What aprof makes of a verl trainer config."""

    config: ProfilerConfig
    """aprof's config: profiles what verl's config asks verl to profile."""
    overrides: tuple[str, ...]
    """Hydra overrides (``key=value``) for the verl run: verl's own profiler never starts, while
    its rollout servers still launch with their profiling routes, which only aprof drives."""
    warnings: tuple[str, ...]
    """One line per key aprof does not know or does not use, and per setting verl would not
    act on (each names the verl key)."""


def load(cfg: Mapping[str, object] | str | os.PathLike[str]) -> VerlPlan:
    """The plan of a verl trainer config: a mapping (dict, OmegaConf DictConfig) or a YAML file.

    Give the config as verl would run without aprof; then run verl with the plan's overrides.
    Raises ConfigError naming the verl key (or the file) on a malformed config.
    """
    if isinstance(cfg, str | os.PathLike):
        data = read_config_file(cfg)
        if not isinstance(data, Mapping):
            raise ConfigError(str(cfg), "a verl config must be a mapping at the top level")
        cfg = data
    config, overrides, warnings = map_verl(cfg)
    return VerlPlan(config=config, overrides=overrides, warnings=warnings)
