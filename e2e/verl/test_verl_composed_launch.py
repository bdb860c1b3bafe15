"""A plan's overrides in verl 0.9.1's own trainer config, composed by Hydra as ``main_ppo``
composes it: the composed config holds Ray's worker setup hook, verl's profiler off, and an
``aprof`` block that the launch check (``aprof.verl.aprof_config``) gives back as the plan's
config, its save_path made absolute."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import aprof

if importlib.util.find_spec("verl") is None:
    pytest.skip("verl is not installed (nox -s verl installs 0.9.1)", allow_module_level=True)
hydra: Any = pytest.importorskip("hydra", reason="hydra-core (verl's config composer)")
OmegaConf: Any = pytest.importorskip("omegaconf").OmegaConf

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"
SETTINGS = {
    "torch, rollout profiled": [
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,3]",
        "global_profiler.save_path='my runs/profile'",
        f"{ACTOR}.enable=true",
        f"{ACTOR}.ranks=[0]",
        f"{ACTOR}.tool_config.torch.discrete=true",
        f"{ROLLOUT}.tool_config.torch.discrete=true",
        f"{ROLLOUT}.tool_config.torch.profile_token_start=2",
        f"{ROLLOUT}.tool_config.torch.profile_token_end=6",
    ],
    "nsys, rollout not profiled": [
        "global_profiler.tool=nsys",
        "global_profiler.steps=[2]",
        f"{ACTOR}.enable=true",
        f"{ACTOR}.tool_config.nsys.discrete=true",
    ],
    "verl's defaults": [],
}


def composed(overrides: list[str]) -> dict[str, Any]:
    """verl's ``ppo_trainer`` config with ``overrides``, resolved: what verl's trainer reads."""
    with hydra.initialize_config_module("verl.trainer.config", version_base=None):
        cfg = hydra.compose("ppo_trainer", overrides=overrides)
    plain: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)
    return plain


@pytest.mark.parametrize("settings", list(SETTINGS.values()), ids=list(SETTINGS))
def test_a_plans_overrides_compose_into_a_run_aprof_accepts(
    settings: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = aprof.verl.load(composed(settings))
    assert not [w for w in plan.warnings if "unknown key" in w], plan.warnings

    cfg = composed([*settings, *plan.overrides])
    hook = cfg["ray_kwargs"]["ray_init"]["runtime_env"]["worker_process_setup_hook"]
    assert hook == "aprof.verl.hook.install"
    assert cfg["global_profiler"]["steps"] is None
    window = cfg["actor_rollout_ref"]["rollout"]["profiler"]["tool_config"]["torch"]
    if plan.config.rollout.enable:  # verl's token window cleared: aprof bounds its own
        assert (window["profile_token_start"], window["profile_token_end"]) == (None, None)

    checked = aprof.verl.aprof_config(cfg)
    assert checked is not None
    save_path = plan.config.global_profiler.save_path
    assert checked.global_profiler.save_path == tmp_path / save_path
    wanted = plan.config.model_dump()
    wanted["global_profiler"]["save_path"] = tmp_path / save_path
    assert checked.model_dump() == wanted
    # verl's own settings beside it untouched: the run profiles what verl was asked to.
    assert cfg["global_profiler"]["tool"] == composed(settings)["global_profiler"]["tool"]


def test_verls_own_profiler_left_on_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = SETTINGS["torch, rollout profiled"]
    plan = aprof.verl.load(composed(settings))
    aprof_on = [o for o in plan.overrides if o.startswith("++")]  # verl's profiler left on
    with pytest.raises(aprof.ConfigError) as info:
        aprof.verl.aprof_config(composed([*settings, *aprof_on]))
    assert info.value.key == "global_profiler.steps"
