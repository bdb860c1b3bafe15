"""aprof for verl (0.9.1).

- ``load(cfg)``: verl's trainer config as the plan of an aprof run (aprof's config, what it
  left out, the overrides that switch verl's own profiler off).
- ``ProfiledLLMServerClient`` (and ``ProfiledClientMixin`` for other verl client classes): the
  rollout client for ``LLMServerManager.get_client(client_cls=...)``.
- ``ProfiledTrainerMixin``: each global step of ``RayPPOTrainer.fit()`` an aprof step; with
  ``ProfiledAgentLoopManager`` named in verl's config, the agent loops ``init_workers()``
  starts gate and count through aprof.
- ``profiled_worker(worker_cls, cfg, role=...)`` and ``worker_group(wg, role, cfg)``: verl's
  ``@DistProfiler.annotate`` stages of a ``@register`` worker group captured by aprof.

``import aprof.verl`` imports neither verl nor ``aprof.ray``: the trainer, client and worker
names import what they need when first used (``pip install verl`` next to aprof).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aprof._config import ProfilerConfig, read_config_file
from aprof._errors import ConfigError
from aprof.verl._config import STAGES, map_verl

if TYPE_CHECKING:
    from aprof.verl._agent_loops import ProfiledAgentLoopManager
    from aprof.verl._client import ProfiledClientMixin, ProfiledLLMServerClient
    from aprof.verl._trainer import ProfiledTrainerMixin
    from aprof.verl._workers import profiled_worker, worker_group

__all__ = [
    "STAGES",
    "ProfiledAgentLoopManager",
    "ProfiledClientMixin",
    "ProfiledLLMServerClient",
    "ProfiledTrainerMixin",
    "VerlPlan",
    "load",
    "profiled_worker",
    "worker_group",
]

_TRAINER = "aprof.verl._trainer"
"""Needs ``aprof.ray`` (verl's trainer shares the profiler with its agent loops), not verl."""
_NEEDS_VERL = {
    "ProfiledAgentLoopManager": "aprof.verl._agent_loops",
    "ProfiledClientMixin": "aprof.verl._client",
    "ProfiledLLMServerClient": "aprof.verl._client",
    "profiled_worker": "aprof.verl._workers",
    "worker_group": "aprof.verl._workers",
}


def __getattr__(name: str) -> Any:
    # verl (and torch, Ray) load only when a verl-side name is used.
    if name == "ProfiledTrainerMixin":
        return importlib.import_module(_TRAINER).ProfiledTrainerMixin
    module = _NEEDS_VERL.get(name)
    if module is None:
        raise AttributeError(f"module 'aprof.verl' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"aprof.verl.{name} needs verl: pip install verl ({exc})") from exc
    return getattr(imported, name)


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
