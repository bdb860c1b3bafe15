"""verl 0.9.1's own trainer configs through ``aprof.verl.load``: the YAML files the installed
package ships (read from its folder: verl itself is not imported, its GPU stack is absent) and
OmegaConf's ``DictConfig`` of them, as verl's trainer holds its config."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import aprof

_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip("verl is not installed (nox -s verl installs 0.9.1)", allow_module_level=True)
OmegaConf: Any = pytest.importorskip("omegaconf").OmegaConf
CONFIGS = Path(next(iter(_SPEC.submodule_search_locations))) / "trainer" / "config"
TRAINERS = sorted(CONFIGS.glob("_generated_*trainer.yaml"))
ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"


def _composed(path: Path, *dotlist: str) -> Any:
    """The shipped config, an OmegaConf ``DictConfig``, with ``dotlist`` set, as
    ``main_ppo key=value ...`` composes it."""
    return OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(list(dotlist)))


def test_verl_ships_the_trainers_we_map() -> None:
    names = {p.name for p in TRAINERS}
    assert "_generated_ppo_trainer.yaml" in names
    assert "_generated_ppo_megatron_trainer.yaml" in names


@pytest.mark.parametrize("path", TRAINERS, ids=lambda p: p.name)
@pytest.mark.parametrize("form", ["file", "dictconfig"])
def test_every_shipped_trainer_config_maps_without_unknown_keys(path: Path, form: str) -> None:
    source: Any = path if form == "file" else OmegaConf.load(path)
    plan = aprof.verl.load(source)
    assert not [w for w in plan.warnings if "unknown key" in w], plan.warnings
    # verl's default: no tool, nothing profiled; the plan says so and profiles nothing.
    assert any(w.startswith("global_profiler.tool: null") for w in plan.warnings)
    assert not plan.config.rollout.enable
    assert not any(role.enable for role in plan.config.roles.values())
    hook, block, *verls = plan.overrides
    assert hook.endswith("worker_process_setup_hook=aprof.verl.hook.install")
    assert block.startswith("++aprof={")
    assert verls == ["global_profiler.steps=null"]


@pytest.mark.parametrize("path", TRAINERS, ids=lambda p: p.name)
def test_a_profiled_run_maps_steps_ranks_and_the_rollout_window(path: Path) -> None:
    cfg = _composed(
        path,
        "global_profiler.tool=torch",
        "global_profiler.steps=[1,2,5]",
        f"{ACTOR}.enable=true",
        f"{ACTOR}.ranks=[0]",
        f"{ACTOR}.tool_config.torch.discrete=true",
        f"{ROLLOUT}.tool_config.torch.profile_token_start=2",
        f"{ROLLOUT}.tool_config.torch.profile_token_end=0",
    )
    plan = aprof.verl.load(cfg)
    config = plan.config
    assert [n for n in range(1, 7) if n in config.global_profiler.steps] == [1, 2, 5]
    actor = config.roles["actor"]
    assert (actor.enable, actor.discrete) == (True, True)
    assert actor.selects(0) and not actor.selects(1)
    # The rollout inherits the actor's enable and discrete through verl's interpolations.
    assert config.rollout.enable
    assert (config.rollout.delay, config.rollout.forward_steps) == (2, None)  # end 0: no end
    assert f"{ROLLOUT}.tool_config.torch.profile_token_start=null" in plan.overrides
    assert not [w for w in plan.warnings if "unknown key" in w], plan.warnings
    # verl's hybrid engine (its config's own hybrid_engine: true): every role on the
    # rollout's GPUs.
    assert [(c.role, c.replicas) for c in config.colocated] == [(r, "all") for r in config.roles]


@pytest.mark.parametrize("path", TRAINERS[:1], ids=lambda p: p.name)
def test_the_table_of_issue_16_on_verl_s_own_config(path: Path) -> None:
    # Role-level nsys discrete: verl's worker reads the role's own flag.
    plan = aprof.verl.load(
        _composed(
            path,
            "global_profiler.tool=nsys",
            "global_profiler.steps=[1]",
            f"{ACTOR}.enable=true",
            f"{ACTOR}.tool_config.nsys.discrete=true",
        )
    )
    assert plan.config.roles["actor"].discrete
    assert not plan.config.rollout.enable  # verl does not profile the rollout with nsys
    # verl's nsys worker options are kept; those aprof cannot honour are said, not dropped.
    nsys = plan.config.tool_config.nsys
    assert nsys.options["cuda-memory-usage"] == "true"
    assert nsys.options["cuda-graph-trace"] == "graph"
    assert nsys.trace == ["cuda", "nvtx", "cublas", "ucx"]
    text = "\n".join(plan.warnings)
    assert "capture-range-end" in text and "controller_nsight_options" in text
    # The rollout is not profiled when not discrete, as in verl, and the plan says why.
    plan = aprof.verl.load(
        _composed(path, "global_profiler.tool=torch", "global_profiler.steps=[1]",
                  f"{ACTOR}.enable=true")
    )  # fmt: skip
    assert not plan.config.rollout.enable
    assert any("discrete" in w and "rollout" in w for w in plan.warnings)
    # Typos and keys aprof does not use are warned about, with a did-you-mean.
    plan = aprof.verl.load(
        _composed(path, "global_profiler.tool=torch", "global_profiler.step=[1,2,5]",
                  f"{ACTOR}.rank=[1]", "global_profiler.relocate_results=true")
    )  # fmt: skip
    text = "\n".join(plan.warnings)
    assert "global_profiler.step: unknown key (did you mean 'steps'?)" in text
    assert f"{ACTOR}.rank: unknown key (did you mean 'ranks'?)" in text
    assert "global_profiler.relocate_results is verl's own and not used by aprof" in text
    # An error names the key the user set: the actor's, which the rollout inherits.
    with pytest.raises(aprof.ConfigError, match=rf"{ACTOR}\.ranks"):
        aprof.verl.load(
            _composed(path, "global_profiler.tool=torch", "global_profiler.steps=[1]",
                      f"{ACTOR}.enable=true", f"{ACTOR}.ranks=[-1]")
        )  # fmt: skip
    # The plain loader points a verl config to the verl entry point.
    with pytest.raises(aprof.ConfigError, match=r"aprof\.verl\.load"):
        aprof.load_config(OmegaConf.to_container(OmegaConf.load(path)))  # type: ignore[arg-type]


def test_a_main_ppo_cfg_job_dump_maps_as_the_user_set_it(tmp_path: Path) -> None:
    pytest.importorskip("verl.trainer.main_ppo", reason="its trainer's imports (torchdata, peft)")
    overrides = [
        "global_profiler.steps=[1,3]",
        "global_profiler.tool=torch",
        "actor_rollout_ref.actor.profiler.enable=true",
        "actor_rollout_ref.actor.profiler.ranks=[1]",
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=true",
        "actor_rollout_ref.rollout.profiler.enable=true",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=true",
    ]
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", *overrides]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dump = tmp_path / "job.yaml"  # verl's composed trainer config, as the trainer gets it
    dump.write_text(done.stdout)

    plan = aprof.verl.load(dump)
    assert plan.warnings == ()
    assert plan.overrides[2:] == ("global_profiler.steps=null",)
    assert str(plan.config.global_profiler.steps) == "1,3"
    actor = plan.config.roles["actor"]
    assert (actor.enable, actor.ranks, actor.discrete) == (True, [1], True)
    assert plan.config.rollout.enable and plan.config.rollout.replicas == [0]

    validated = subprocess.run(
        [sys.executable, "-m", "aprof", "validate", "--verl", str(dump)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert validated.returncode == 0, validated.stderr
    assert "global_profiler.steps=null" in validated.stdout
