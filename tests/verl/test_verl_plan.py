"""`aprof.verl.load`: a verl 0.9.1 trainer config as aprof's plan (config, overrides, warnings)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof import ConfigError, load_config
from aprof.cli import main
from aprof.verl import STAGES, VerlPlan, load
from aprof.verl._launch import launch_overrides

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"


def verl_cfg(tool: object = "torch", **changes: object) -> dict[str, Any]:
    """A small composed verl config (actor and rollout discrete), keys (`a__b`) changed."""
    cfg: dict[str, Any] = {
        "global_profiler": {
            "_target_": "verl.utils.profiler.ProfilerConfig",
            "tool": "torch",
            "steps": [1, 2],
            "save_path": "outputs/profile",
            "relocate_results": False,
            "finish_hook_cmd": None,
            "global_tool_config": {"nsys": {"discrete": False}},
        },
        "actor_rollout_ref": {
            "actor": {
                "profiler": {
                    "tool": "torch",
                    "enable": True,
                    "ranks": [0],
                    "save_path": "outputs/profile",
                    "relocate_results": False,
                    "tool_config": {"torch": {"discrete": True}},
                }
            },
            "rollout": {
                "tensor_model_parallel_size": 2,
                "profiler": {
                    "tool": "torch",
                    "enable": True,
                    "ranks": [0],
                    "tool_config": {"torch": {"discrete": True}},
                },
            },
        },
    }
    for block in ("global_profiler", f"{key(ACTOR)}", f"{key(ROLLOUT)}"):
        changes.setdefault(f"{block}__tool", tool)  # Hydra composes the global value into each
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = cfg
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return copy.deepcopy(cfg)


DELETE = object()


def key(path: str) -> str:
    """A dotted verl path as a `verl_cfg` keyword."""
    return path.replace(".", "__")


def test_plan_of_a_clean_config() -> None:
    plan = load(verl_cfg())
    assert isinstance(plan, VerlPlan)
    assert plan.warnings == ()
    # aprof on (the hook, its block), then verl's own profiler off.
    assert plan.overrides == (*launch_overrides(plan.config), "global_profiler.steps=null")
    assert plan.overrides[0].startswith("++ray_kwargs.ray_init.runtime_env.")
    assert plan.overrides[1].startswith("++aprof={")
    assert plan.config.rollout.enable and plan.config.roles["actor"].discrete
    assert aprof.verl.load(verl_cfg()).config == plan.config
    assert aprof.verl.load is load
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.warnings = ()  # type: ignore[misc]


def test_load_reads_a_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text("global_profiler: {tool: torch, steps: [3]}\n")
    assert load(path).config.global_profiler.steps.to_config() == [3]
    assert load(str(path)) == load(path)
    path.write_text("[1]\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(path)


def test_role_level_nsys_discrete_wins_over_the_global_block() -> None:
    cfg = verl_cfg("nsys", **{key(f"{ACTOR}.tool_config.nsys.discrete"): True})
    assert load(cfg).config.roles["actor"].discrete is True
    # Unset on the role: the global nsys block's value, as verl's role YAML defaults it.
    cfg["global_profiler"]["global_tool_config"]["nsys"]["discrete"] = True
    del cfg["actor_rollout_ref"]["actor"]["profiler"]["tool_config"]["nsys"]
    assert load(cfg).config.roles["actor"].discrete is True


@pytest.mark.parametrize(("start", "delay"), [(None, 0), (5, 5)])
def test_token_end_0_means_no_limit(start: int | None, delay: int) -> None:
    window = f"{ROLLOUT}.tool_config.torch"
    cfg = verl_cfg(
        **{key(f"{window}.profile_token_start"): start, key(f"{window}.profile_token_end"): 0}
    )
    rollout = load(cfg).config.rollout
    assert (rollout.delay, rollout.forward_steps) == (delay, None)


@pytest.mark.parametrize("tool", [None, DELETE])
def test_no_tool_profiles_nothing(tool: object) -> None:
    plan = load(verl_cfg(tool))
    assert not any(role.enable for role in plan.config.roles.values())
    assert plan.config.rollout.enable is False
    assert plan.warnings == (
        "global_profiler.tool: null: verl profiles nothing without a tool, "
        "so the plan profiles no role and no rollout",
    )


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({key(f"{ROLLOUT}.tool_config.torch.discrete"): False}, f"{ROLLOUT}.tool_config.torch"),
        ({"tool": "nsys"}, "only with torch or npu, not 'nsys'"),
        ({"tool": "torch_memory"}, "not 'torch_memory'"),
    ],
)
def test_rollout_profiled_only_when_verl_would(changes: dict[str, Any], fragment: str) -> None:
    plan = load(verl_cfg(**changes))
    assert plan.config.rollout.enable is False
    (warning,) = (w for w in plan.warnings if "rollout" in w)
    assert fragment in warning and warning.endswith("so the plan does not profile the rollout")
    assert plan.overrides[2:] == ("global_profiler.steps=null",)


def test_rollout_discrete_inherits_the_actors() -> None:
    cfg = verl_cfg(**{key(f"{ROLLOUT}.tool_config"): DELETE})
    assert load(cfg).config.rollout.enable is True
    cfg["actor_rollout_ref"]["actor"]["profiler"]["tool_config"]["torch"]["discrete"] = False
    plan = load(cfg)
    assert plan.config.rollout.enable is False
    assert any(w.startswith(f"{ACTOR}.tool_config.torch.discrete: false:") for w in plan.warnings)


def test_schedule_uses_verls_stage_names() -> None:
    schedule = {"wait": 1, "warmup": 1, "active": 2, "repeat": 1}
    cfg = verl_cfg(**{key(f"{ACTOR}.tool_config.torch.schedule"): schedule})
    mapped = load(cfg).config.tool_config.torch.schedule
    assert mapped is not None and mapped.stages == ["actor_update"]
    assert {"actor_update", "actor_compute_log_prob", "ref_compute_log_prob"} <= set(STAGES)
    plan = load(verl_cfg("npu", **{key(f"{ACTOR}.tool_config.torch.schedule"): schedule}))
    assert plan.config.tool_config.torch.schedule is None
    assert f"{ACTOR}.tool_config.torch.schedule: used only with tool torch, not 'npu'" in (
        plan.warnings
    )


def test_typos_warn_with_did_you_mean() -> None:
    cfg = verl_cfg(**{"global_profiler__step": [1, 2, 5], key(f"{ACTOR}.rank"): [1]})
    warnings = load(cfg).warnings
    assert "global_profiler.step: unknown key (did you mean 'steps'?)" in warnings
    assert f"{ACTOR}.rank: unknown key (did you mean 'ranks'?)" in warnings
    cfg = verl_cfg(**{key(f"{ROLLOUT}.tool_config.torch.discret"): True})
    assert f"{ROLLOUT}.tool_config.torch.discret: unknown key (did you mean 'discrete'?)" in (
        load(cfg).warnings
    )


def test_keys_aprof_does_not_use_warn() -> None:
    cfg = verl_cfg(
        global_profiler__relocate_results=True,
        global_profiler__finish_hook_cmd="tar czf out.tgz outputs",
        **{key(f"{ACTOR}.save_path"): "/elsewhere", key(f"{ACTOR}.tool"): "nsys"},
    )
    warnings = load(cfg).warnings
    assert any(w.startswith("global_profiler.relocate_results is verl's own") for w in warnings)
    assert any(w.startswith("global_profiler.finish_hook_cmd is verl's own") for w in warnings)
    assert any(w.startswith(f"{ACTOR}.save_path is verl's own") for w in warnings)
    why = "aprof profiles every role with global_profiler.tool ('torch')"
    assert f"{ACTOR}.tool is verl's own and not used by aprof: {why}" in warnings
    # The rollout's copies of the actor's values are inherited, not set: no warning for them.
    assert not any(w.startswith(ROLLOUT) for w in warnings)


def test_errors_name_the_key_the_user_set() -> None:
    # A composed config: the rollout holds a copy of the actor's ranks.
    cfg = verl_cfg(**{key(f"{ACTOR}.ranks"): [-1], key(f"{ROLLOUT}.ranks"): [-1]})
    with pytest.raises(ConfigError) as info:
        load(cfg)
    assert info.value.key == f"{ACTOR}.ranks[0]"
    # A raw config: the rollout's value is an interpolation of the actor's.
    cfg["actor_rollout_ref"]["rollout"]["profiler"]["ranks"] = f"${{oc.select:{ACTOR}.ranks,[]}}"
    with pytest.raises(ConfigError) as info:
        load(cfg)
    assert info.value.key == f"{ACTOR}.ranks[0]"
    # Set on the rollout alone: the rollout's key.
    cfg = verl_cfg(**{key(f"{ROLLOUT}.ranks"): [-1]})
    with pytest.raises(ConfigError) as info:
        load(cfg)
    assert info.value.key == f"{ROLLOUT}.ranks[0]"


def test_overrides_clear_verls_token_window() -> None:
    window = f"{ROLLOUT}.tool_config.torch"
    cfg = verl_cfg(**{key(f"{window}.profile_token_end"): 40})
    assert load(cfg).overrides[2:] == (
        "global_profiler.steps=null",
        f"{window}.profile_token_end=null",
    )


@pytest.mark.parametrize("marker", ["global_profiler", "actor_rollout_ref"])
def test_plain_loader_points_to_the_verl_entry_point(marker: str) -> None:
    cfg = verl_cfg()
    if marker == "actor_rollout_ref":
        del cfg["global_profiler"]
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert "aprof.verl.load(cfg)" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("mandatory", "marker"),
    [
        ("actor_rollout_ref.model.path", "global_profiler._target_"),
        ("global_profiler.save_path", "global_profiler._target_"),
        ("actor_rollout_ref", "actor_rollout_ref"),  # no _target_: the block alone says verl
        ("global_profiler", "actor_rollout_ref"),
    ],
)
def test_plain_loader_points_a_dictconfig_holding_a_mandatory_value_to_the_verl_entry_point(
    mandatory: str, marker: str
) -> None:
    """verl's trainer config as Hydra gives it: an OmegaConf DictConfig, which raises on
    reading a `???` it still holds (issue 23)."""
    omegaconf = pytest.importorskip("omegaconf")
    cfg = verl_cfg()
    *parents, last = mandatory.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = "???"
    if marker == "actor_rollout_ref" and isinstance(cfg["global_profiler"], dict):
        del cfg["global_profiler"]["_target_"]
    with pytest.raises(ConfigError) as info:
        load_config(omegaconf.OmegaConf.create(cfg))
    assert info.value.key == marker
    assert "aprof.verl.load(cfg)" in str(info.value) and "\n" not in str(info.value)
    if mandatory == "actor_rollout_ref.model.path":  # the one door reads it
        assert load(omegaconf.OmegaConf.create(cfg)).config == load(verl_cfg()).config


def test_launch_args_prints_the_overrides_shell_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(
        "global_profiler: {tool: torch, steps: [1], stepz: 2, save_path: 'my profile'}\n"
    )
    assert main(["launch-args", "--verl", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == "warning: global_profiler.stepz: unknown key (did you mean 'steps'?)\n"
    plan = load(path)
    assert str(plan.config.global_profiler.save_path) == "my profile"
    # One shell word a line: bash reads the lines back as the plan's overrides.
    words = subprocess.run(
        ["bash", "-c", 'eval "extra=($(cat))"; printf "%s\\n" "${extra[@]}"'],
        input=out,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.splitlines()
    assert tuple(words) == plan.overrides and len(out.splitlines()) == len(words)
    assert f"save_path:'{tmp_path / 'my profile'}'" in words[1]  # absolute, quoted for Hydra


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--verl"], "--verl needs CONFIG"),
        (["--verl", "--engine", "vllm", "--port", "0", "CFG"], "--engine, --port: not used"),
        (["--verl", "--command", "CFG"], "--command: not used with --verl"),
        (["CFG"], "--engine and --version are required (or --verl"),
        (["--engine", "vllm", "CFG"], "--engine and --version are required"),
    ],
)
def test_launch_args_says_which_options_go_with_verl(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text("global_profiler: {tool: torch, steps: [1]}\n")
    assert main(["launch-args", *[str(path) if a == "CFG" else a for a in argv]]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("aprof launch-args: ") and message in err


def test_plain_launch_args_points_a_verl_config_to_verl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text("actor_rollout_ref: {}\n")
    assert main(["launch-args", "--engine", "vllm", "--version", "0.13.0", str(path)]) == 1
    assert "aprof.verl.load(cfg)" in capsys.readouterr().err  # and launch-args --verl


NSYS = "global_profiler.global_tool_config.nsys"
TORCH_MEMORY = "global_profiler.global_tool_config.torch_memory"
# verl 0.9.1's composed defaults (_generated_ppo_trainer.yaml).
CONTROLLER_NSIGHT = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true"}
WORKER_NSIGHT = {
    **CONTROLLER_NSIGHT,
    "cuda-graph-trace": "graph",
    "capture-range": "cudaProfilerApi",
    "capture-range-end": None,
    "kill": "none",
}


def nsys_cfg(tool: str = "nsys", **worker: object) -> dict[str, Any]:
    return verl_cfg(
        tool,
        **{
            key(f"{NSYS}.controller_nsight_options"): CONTROLLER_NSIGHT,
            key(f"{NSYS}.worker_nsight_options"): {**WORKER_NSIGHT, **worker},
        },
    )


def test_nsys_worker_options_are_kept_and_aprofs_own_are_warned_about() -> None:
    plan = load(nsys_cfg())
    nsys = plan.config.tool_config.nsys
    assert nsys.trace == ["cuda", "nvtx", "cublas", "ucx"]
    assert nsys.options == {
        "cuda-memory-usage": "true",
        "cuda-graph-trace": "graph",
        "kill": "none",
    }
    end, controller = (w for w in plan.warnings if w.startswith(NSYS))
    assert end.startswith(
        f"{NSYS}.worker_nsight_options.capture-range-end: null "
        "(verl: repeat-shutdown:<6*len(steps)>): not kept; aprof ends each capture range "
        "with 'repeat'"
    )
    assert controller.startswith(
        f"{NSYS}.controller_nsight_options: not used by aprof: they apply to verl's driver"
    )


def test_nsys_capture_range_end_repeat_shutdown_is_refused_with_a_warning() -> None:
    warnings = load(nsys_cfg(**{"capture-range-end": "repeat-shutdown:12"})).warnings
    assert any(
        w.startswith(f"{NSYS}.worker_nsight_options.capture-range-end: 'repeat-shutdown:12'")
        and "shut the worker down" in w
        for w in warnings
    )
    kept = load(nsys_cfg(**{"capture-range-end": "repeat", "capture-range": "nvtx"}))
    assert not any("capture-range-end" in w for w in kept.warnings)
    assert any(
        w.startswith(f"{NSYS}.worker_nsight_options.capture-range: 'nvtx': not kept")
        for w in kept.warnings
    )


def test_nsys_options_yaml_scalars_become_text_and_bad_ones_name_the_verl_key() -> None:
    plan = load(nsys_cfg(**{"cuda-memory-usage": True, "sampling-frequency": 1000}))
    assert plan.config.tool_config.nsys.options["cuda-memory-usage"] == "true"
    assert plan.config.tool_config.nsys.options["sampling-frequency"] == "1000"
    with pytest.raises(ConfigError, match="without whitespace") as err:
        load(nsys_cfg(kill="sig term"))
    assert err.value.key == f"{NSYS}.worker_nsight_options.kill"
    with pytest.raises(ConfigError, match="long option name") as err:
        load(nsys_cfg(Kill="none"))
    assert err.value.key == f"{NSYS}.worker_nsight_options.Kill"


def test_nsys_option_warnings_only_when_nsys_is_the_tool() -> None:
    plan = load(nsys_cfg("torch"))
    assert not any(w.startswith(NSYS) for w in plan.warnings)
    assert plan.config.tool_config.nsys.options["kill"] == "none"


def test_torch_memory_context_stacks_and_verls_automatic_oom_snapshot() -> None:
    block = {
        "trace_alloc_max_entries": 5000,
        "stack_depth": 16,
        "memory_snapshot_num_steps": 1,
        "context": "alloc",
        "stacks": "python",
    }
    plan = load(verl_cfg("torch_memory", **{key(TORCH_MEMORY): block}))
    memory = plan.config.tool_config.torch_memory
    assert (memory.max_entries, memory.stack_depth) == (5000, 16)
    assert (memory.context, memory.stacks) == ("alloc", "python")
    assert memory.snapshot_on_oom  # verl attaches its OOM observer with no key to stop it
    assert not any(w.startswith(TORCH_MEMORY) for w in plan.warnings)


def test_torch_memory_snapshot_num_steps_above_one_is_warned_about() -> None:
    cfg = verl_cfg("torch_memory", **{key(f"{TORCH_MEMORY}.memory_snapshot_num_steps"): 3})
    (warning,) = (w for w in load(cfg).warnings if w.startswith(TORCH_MEMORY))
    assert warning.startswith(f"{TORCH_MEMORY}.memory_snapshot_num_steps: 3: not used by aprof")
    with pytest.raises(ConfigError, match="python") as err:
        load(verl_cfg("torch_memory", **{key(f"{TORCH_MEMORY}.stacks"): "cpp"}))
    assert err.value.key == f"{TORCH_MEMORY}.stacks"


@pytest.mark.parametrize("hybrid", [True, None])
def test_the_hybrid_engine_colocates_every_role_with_every_replica(hybrid: bool | None) -> None:
    """verl 0.9.1's hybrid engine (its default, and its only layout) runs every role on the
    rollout servers' GPUs: ``colocated`` says so, exclusive by the tool (npu: yes)."""
    changes: dict[str, Any] = {"actor_rollout_ref__hybrid_engine": hybrid}
    changes[key("actor_rollout_ref.ref.profiler")] = {"enable": True}
    cfg = verl_cfg("npu", **changes)
    if hybrid is None:
        del cfg["actor_rollout_ref"]["hybrid_engine"]
    plan = load(cfg)
    assert [(c.role, c.replicas, c.exclusive) for c in plan.config.colocated] == [
        ("actor", "all", None),
        ("ref", "all", None),
    ]
    assert plan.config.colocated[0].excludes(("npu", "npu"))
    assert not load(verl_cfg("torch")).config.colocated[0].excludes(("torch", "torch"))


def test_a_config_without_the_hybrid_engine_colocates_nothing() -> None:
    assert load(verl_cfg(actor_rollout_ref__hybrid_engine=False)).config.colocated == []
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.hybrid_engine: expected true"):
        load(verl_cfg(actor_rollout_ref__hybrid_engine="yes"))
