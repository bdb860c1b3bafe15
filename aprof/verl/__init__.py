"""aprof for verl (0.9.1).

- ``aprof.verl.hook.install``: the switch inside verl's ``python -m verl.trainer.main_ppo``
  (Ray's worker setup hook): verl's V1 trainer in every mode, and its legacy trainer, run with
  aprof when verl's config holds an ``aprof`` block; nothing else to write.
- ``load(cfg)``: verl's trainer config as the plan of an aprof run (aprof's config, what it
  left out, the overrides that turn aprof on in verl's ``main_ppo``: Ray's worker setup hook
  ``aprof.verl.hook.install``, the ``aprof`` block, verl's own profiler off).
- ``aprof_config(cfg)``: the ``aprof`` block of a resolved verl config (or a YAML file),
  checked as verl's trainer checks it at launch.
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

from aprof._config import ProfilerConfig
from aprof.verl._config import STAGES, map_verl
from aprof.verl._launch import aprof_config, launch_overrides, verl_mapping

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
    "aprof_config",
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
    """Every Hydra override (``key=value``) to add to verl's ``main_ppo`` command line, in
    order: Ray's worker setup hook ``aprof.verl.hook.install`` (``++ray_kwargs...``), ``config``
    as verl's top-level ``aprof`` block (``++aprof={...}``, save_path absolute), then those that
    switch verl's own profiler off (``global_profiler.steps=null``, and verl's rollout token
    window cleared when aprof profiles the rollout); the rollout servers still launch with
    their profiling routes, which only aprof drives."""
    warnings: tuple[str, ...]
    """One line per key aprof does not know or does not use, and per setting verl would not
    act on (each names the verl key)."""


def load(cfg: Mapping[str, object] | str | os.PathLike[str]) -> VerlPlan:
    """The plan of a verl trainer config: a mapping (dict, OmegaConf DictConfig) or a YAML file.

    Give the config as verl would run without aprof; then run verl with the plan's overrides
    (a relative save_path in them is made absolute against the current folder).
    Raises ConfigError naming the verl key (or the file) on a malformed config.
    """
    config, overrides, warnings = map_verl(verl_mapping(cfg))
    return VerlPlan(
        config=config, overrides=(*launch_overrides(config), *overrides), warnings=warnings
    )
