"""The verl mapping: a verl trainer config (global_profiler + role profiler blocks) as aprof's."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from aprof._config import (
    NPU_CONTENTS,
    TORCH_CONTENTS,
    ProfilerConfig,
    config_error,
    key_member,
    show_value,
    to_plain,
)
from aprof._errors import ConfigError

_ACTOR = "actor_rollout_ref.actor.profiler"
_ROLLOUT = "actor_rollout_ref.rollout.profiler"
_VERL_ROLES = {
    "actor": _ACTOR,
    "ref": "actor_rollout_ref.ref.profiler",
    "critic": "critic.profiler",
}
_NSYS = "global_profiler.global_tool_config.nsys"
_TORCH_MEMORY = "global_profiler.global_tool_config.torch_memory"

STAGES = (
    "actor_update",
    "actor_compute_log_prob",
    "ref_compute_log_prob",
    "compute_values",
    "critic_update",
    "compute_rm_score",
)
"""verl 0.9.1's stage names (``engine_workers.py``), as ``aprof.staged`` should name them."""
_SCHEDULED_STAGES = ["actor_update"]  # verl's only stage built with scheduled=True


class _VerlMap:
    """Reads a verl config and builds aprof's config dict, remembering where each key came from."""

    def __init__(self, verl_cfg: Mapping[str, object]) -> None:
        self.verl = verl_cfg
        self.data: dict[str, Any] = {}
        self.origin: dict[str, str] = {}
        self.warnings: list[str] = []

    def get(self, path: str) -> object:
        """The value at a dotted verl path; None when missing, null or an unresolved `${...}`."""
        node: object = self.verl
        parts = path.split(".")
        for i, part in enumerate(parts):
            if node is None:
                return None
            if not isinstance(node, Mapping):
                raise ConfigError(
                    ".".join(parts[:i]), f"expected a mapping, got {show_value(node)}"
                )
            node = node.get(part)
        # A raw verl YAML (not composed by Hydra) holds interpolations such as
        # `${oc.select:actor_rollout_ref.actor.profiler.enable,false}`; they mean "inherit".
        if isinstance(node, str) and node.startswith("${"):
            return None
        return to_plain(node, at=path)

    def put(self, key: str, value: object, verl_path: str, *, keep_none: bool = False) -> None:
        """Set aprof's dotted `key` (skipped when None unless keep_none); note its verl origin."""
        self.origin[key] = verl_path
        if value is None and not keep_none:
            return
        *parents, last = key.split(".")
        node = self.data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    def translate(self, err: ConfigError) -> ConfigError:
        """The same error with aprof's key path replaced by the verl key it came from."""
        key = err.key or ""
        best = max(
            (k for k in self.origin if key == k or key.startswith((k + ".", k + "["))),
            key=len,
            default=None,
        )
        if best is None:
            return err
        return ConfigError(self.origin[best] + key[len(best) :], err.reason)


def _verl_int(value: object, path: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(path, f"expected an integer >= {minimum}, got {show_value(value)}")
    return value


def map_verl(verl_cfg: object) -> tuple[ProfilerConfig, tuple[str, ...], tuple[str, ...]]:
    """``(config, overrides, warnings)`` of a verl trainer config: see ``aprof.verl.VerlPlan``
    (the overrides here only those that switch verl's own profiler off).

    Raises ConfigError naming the verl key path (or None when `verl_cfg` is not a mapping).
    """
    verl_cfg = _plain_omegaconf(verl_cfg)
    if not isinstance(verl_cfg, Mapping):
        raise ConfigError(None, f"expected a verl config mapping, got {show_value(verl_cfg)}")
    m = _VerlMap(verl_cfg)
    try:
        _check_keys(m)
        _map_global(m)
        tool = m.data.get("global_profiler", {}).get("tool", "torch")
        for role, path in _VERL_ROLES.items():
            _map_role(m, role, path, tool)
        _map_tools(m)
        _map_schedule(m, tool)
        _map_rollout(m, tool)
        _map_colocation(m)
        config = ProfilerConfig.model_validate(m.data)
        return config, _overrides(m, config, tool), tuple(m.warnings)
    except ValidationError as exc:
        raise m.translate(config_error(exc, ProfilerConfig)) from None
    except ConfigError as exc:
        raise m.translate(exc) from None
    except (TypeError, KeyError, AttributeError, RecursionError) as exc:  # one error type out
        raise ConfigError(None, f"invalid verl configuration: {exc}") from None


def _plain_omegaconf(cfg: object) -> object:
    """An OmegaConf container as plain dicts and lists; anything else as is.

    Interpolations are resolved; when one cannot be, none are, and each unresolved `${...}`
    then reads as unset (verl's raw YAML uses them for "inherit").
    """
    if not type(cfg).__module__.startswith("omegaconf"):
        return cfg
    omegaconf = importlib.import_module("omegaconf")  # only here: verl's world, not aprof's
    try:
        return omegaconf.OmegaConf.to_container(cfg, resolve=True)
    except omegaconf.errors.OmegaConfBaseException:
        return omegaconf.OmegaConf.to_container(cfg, resolve=False)


# ---------------------------------------------------------------------------------------------
# Keys aprof does not know or does not use
# ---------------------------------------------------------------------------------------------

_Schema = Mapping[str, "_Schema | None"]
"""verl's keys of a block: each with its own keys, or None when its value is free-form."""

_TOOL_CONFIG: _Schema = {
    "nsys": dict.fromkeys(("discrete", "name")),
    "npu": dict.fromkeys(
        ("contents", "level", "analysis", "discrete", "profile_token_start", "profile_token_end")
    ),
    "torch": {
        **dict.fromkeys(("contents", "discrete", "profile_token_start", "profile_token_end")),
        "schedule": dict.fromkeys(("skip_first", "wait", "warmup", "active", "repeat")),
    },
    "torch_memory": dict.fromkeys(
        ("trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps")
    ),
    "precision_debugger": dict.fromkeys(("config_path", "steps", "stages", "strict")),
}
_HOOKS = ("finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks")
_SHARED = ("save_path", "relocate_results", *_HOOKS)  # a role's copy of the global value
_GLOBAL: _Schema = {
    **dict.fromkeys(("tool", "steps", "profile_continuous_steps", *_SHARED)),
    "global_tool_config": {
        "nsys": dict.fromkeys(("discrete", "controller_nsight_options", "worker_nsight_options")),
        "torch_memory": dict.fromkeys(
            (
                "trace_alloc_max_entries",
                "stack_depth",
                "memory_snapshot_num_steps",
                "context",
                "stacks",
                "kw_args",
            )
        ),
        "precision_debugger": _TOOL_CONFIG["precision_debugger"],
    },
}
_ROLE: _Schema = {
    **dict.fromkeys(("tool", "enable", "all_ranks", "ranks", "global_tool_config", *_SHARED)),
    "tool_config": _TOOL_CONFIG,
}
_HOOK_WHY = "aprof runs no command after the last step; its manifest lists every capture"
_NOT_USED = {
    "relocate_results": "aprof moves no file; its manifest lists where each capture was written",
    **dict.fromkeys(_HOOKS, _HOOK_WHY),
}
"""verl's keys aprof does not use, and why: warned about when set to anything but verl's
default (null, false or [])."""


def _check_keys(m: _VerlMap) -> None:
    """Warn about each profiler key verl does not know, and each verl key aprof does not use."""
    _unknown_keys(m, m.verl.get("global_profiler"), _GLOBAL, "global_profiler")
    for key, why in _NOT_USED.items():
        if _find(m, f"global_profiler.{key}") not in (None, False, []):
            m.warnings.append(f"global_profiler.{key} is verl's own and not used by aprof: {why}")
    for path in (*_VERL_ROLES.values(), _ROLLOUT):
        _unknown_keys(m, _find(m, path), _ROLE, path)
        for key in ("tool", *_SHARED):
            own = _find(m, f"{path}.{key}")
            # A composed config holds each inherited value as a copy: only a different one was
            # set on the role (the rollout block inherits from the actor's).
            inherited = [_find(m, f"global_profiler.{key}")]
            if path == _ROLLOUT:
                inherited.append(_find(m, f"{_ACTOR}.{key}"))
            if own is None or own in inherited:
                continue
            if key in _NOT_USED and own in (False, []):
                continue
            m.warnings.append(f"{path}.{key} is verl's own and not used by aprof: {_why(m, key)}")


def _why(m: _VerlMap, key: str) -> str:
    if key == "tool":
        tool = show_value(_find(m, "global_profiler.tool"))
        return f"aprof profiles every role with global_profiler.tool ({tool})"
    if key == "save_path":
        return "aprof writes every capture under global_profiler.save_path"
    return _NOT_USED[key]


def _find(m: _VerlMap, path: str) -> object:
    """The value at `path`, or None where the config is not shaped as verl's (mapping says so)."""
    try:
        return m.get(path)
    except ConfigError:
        return None


def _unknown_keys(m: _VerlMap, node: object, schema: _Schema, path: str) -> None:
    if not isinstance(node, Mapping):
        return  # a block of the wrong type is the mapping's error
    for key, value in node.items():
        if key == "_target_":  # the class Hydra builds, at any level
            continue
        where = path + key_member(key)
        sub = schema.get(key) if isinstance(key, str) else None
        if not isinstance(key, str) or key not in schema:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "verl has " + ", ".join(schema)
            m.warnings.append(f"{where}: unknown key ({hint})")
        elif sub is not None:
            _unknown_keys(m, value, sub, where)


# ---------------------------------------------------------------------------------------------
# The mapping
# ---------------------------------------------------------------------------------------------


def _profiles(m: _VerlMap) -> bool:
    """False when verl profiles nothing: `global_profiler.tool` null (verl's default)."""
    return "tool" in m.data.get("global_profiler", {})


def _map_global(m: _VerlMap) -> None:
    for ours, theirs in (
        ("tool", "tool"),
        ("steps", "steps"),
        ("save_path", "save_path"),
        ("continuous", "profile_continuous_steps"),
    ):
        m.put(
            f"global_profiler.{ours}",
            m.get(f"global_profiler.{theirs}"),
            f"global_profiler.{theirs}",
        )
    if not _profiles(m):
        m.warnings.append(
            "global_profiler.tool: null: verl profiles nothing without a tool, "
            "so the plan profiles no role and no rollout"
        )
    _map_nsys_options(m)
    for ours, theirs in (
        ("max_entries", "trace_alloc_max_entries"),
        ("stack_depth", "stack_depth"),
        # verl 0.9.1 itself never passes these two to torch (its enable_memory_visualize
        # call takes their defaults, "all"); the user's values are kept as written.
        ("context", "context"),
        ("stacks", "stacks"),
    ):
        path = f"{_TORCH_MEMORY}.{theirs}"
        m.put(f"tool_config.torch_memory.{ours}", m.get(path), path)
    # verl 0.9.1's TorchMemoryProfiler attaches a CUDA OOM observer that dumps a snapshot on
    # every profiled rank, with no key to turn it off (verl/utils/profiler/torch_memory_profile.py,
    # `_attach_oom_observer`); aprof's equivalent is opt-in.
    m.put("tool_config.torch_memory.snapshot_on_oom", True, _TORCH_MEMORY)
    path = f"{_TORCH_MEMORY}.memory_snapshot_num_steps"
    steps = m.get(path)
    if steps not in (None, 1) and m.get("global_profiler.tool") == "torch_memory":
        m.warnings.append(
            f"{path}: {show_value(steps)}: not used by aprof: verl keeps the history across that "
            "many profiled steps and dumps one snapshot; aprof dumps one per capture window "
            "(a step, or a run of consecutive steps with profile_continuous_steps: true)"
        )


def _map_nsys_options(m: _VerlMap) -> None:
    """verl's worker nsight options: trace to its own key, aprof's own ones checked, the rest
    kept as nsys options; warnings only when nsys is the tool."""
    nsys = m.get("global_profiler.tool") == "nsys"
    worker = f"{_NSYS}.worker_nsight_options"
    options = m.get(worker)
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ConfigError(worker, f"expected a mapping, got {show_value(options)}")
    trace = options.get("trace")
    if isinstance(trace, str):  # nsys takes "cuda,nvtx,..."
        trace = [t.strip() for t in trace.split(",") if t.strip()]
    m.put("tool_config.nsys.trace", trace, f"{worker}.trace")
    kept: dict[str, object] = {}
    for name, value in options.items():
        if name == "trace":
            continue
        if name == "capture-range":
            if nsys and value not in (None, "cudaProfilerApi"):
                m.warnings.append(
                    f"{worker}.{name}: {show_value(value)}: not kept: aprof's nsys tool opens "
                    "and closes capture ranges itself (cudaProfilerApi)"
                )
        elif name == "capture-range-end":
            if nsys and value != "repeat":
                was = "null (verl: repeat-shutdown:<6*len(steps)>)" if value is None else None
                m.warnings.append(
                    f"{worker}.{name}: {was or show_value(value)}: not kept; aprof ends each "
                    "capture range with 'repeat' (one report per capture window): "
                    "repeat-shutdown:n and stop-shutdown shut the worker down after a counted "
                    "number of ranges (verl guesses 6 per step), and aprof's ranges are its "
                    "capture windows and never end the training process"
                )
        elif value is not None:
            # YAML reads `true` and `1` as bool and int; nsys takes them as text.
            kept[name] = str(value).lower() if isinstance(value, bool | int) else value
    m.put("tool_config.nsys.options", kept or None, worker)
    if nsys and m.get(f"{_NSYS}.controller_nsight_options"):
        m.warnings.append(
            f"{_NSYS}.controller_nsight_options: not used by aprof: they apply to verl's "
            "driver process (TaskRunner), which aprof does not launch under nsys; aprof "
            "profiles the workers only"
        )


def _map_role(m: _VerlMap, role: str, path: str, tool: object) -> None:
    block = m.get(path)
    if block is None:
        return
    if not isinstance(block, Mapping):
        raise ConfigError(path, f"expected a mapping, got {show_value(block)}")
    m.put(f"roles.{role}", {}, path)
    # verl's role default is disabled, aprof's enabled: say it explicitly.
    enable = m.get(f"{path}.enable") if _profiles(m) else None
    m.put(f"roles.{role}.enable", False if enable is None else enable, f"{path}.enable")
    for key in ("all_ranks", "ranks"):
        m.put(f"roles.{role}.{key}", m.get(f"{path}.{key}"), f"{path}.{key}")
    # verl's worker reads the role's own flag; the role YAML defaults the nsys one to the
    # global nsys block's.
    discrete_path = f"{path}.tool_config.{tool}.discrete"
    discrete = m.get(discrete_path) if tool in ("nsys", "torch", "npu") else None
    if discrete is None and tool == "nsys":
        discrete_path = f"{_NSYS}.discrete"
        discrete = m.get(discrete_path)
    m.put(f"roles.{role}.discrete", discrete, discrete_path)


def _map_tools(m: _VerlMap) -> None:
    for tool, everything in (("torch", TORCH_CONTENTS), ("npu", NPU_CONTENTS)):
        path = f"{_ACTOR}.tool_config.{tool}.contents"
        contents = m.get(path)
        # verl reads an empty contents list as "everything".
        m.put(
            f"tool_config.{tool}.contents", list(everything) if contents == [] else contents, path
        )
    for key in ("level", "analysis"):
        path = f"{_ACTOR}.tool_config.npu.{key}"
        m.put(f"tool_config.npu.{key}", m.get(path), path)


def _map_schedule(m: _VerlMap, tool: object) -> None:
    """verl's torch schedule (its only one), on when ``active > 0`` as verl reads it."""
    path = f"{_ACTOR}.tool_config.torch.schedule"
    schedule = m.get(path)
    if schedule is None:
        return
    if not isinstance(schedule, Mapping):
        raise ConfigError(path, f"expected a mapping, got {show_value(schedule)}")
    if m.get(f"{path}.active") in (None, 0):
        return
    if tool != "torch":
        m.warnings.append(f"{path}: used only with tool torch, not {show_value(tool)}")
        return
    m.put("tool_config.torch.schedule", {"stages": _SCHEDULED_STAGES}, path)
    for key in ("skip_first", "wait", "warmup", "active", "repeat"):
        m.put(f"tool_config.torch.schedule.{key}", m.get(f"{path}.{key}"), f"{path}.{key}")


def _inherited(m: _VerlMap, key: str) -> tuple[object, str]:
    """A rollout profiler key, or the actor's when unset (verl's interpolation default).

    The path named is the actor's when the rollout holds the same value: a composed config
    holds the inherited value as a copy, and the actor's key is the one the user set.
    """
    own, actor = m.get(f"{_ROLLOUT}.{key}"), m.get(f"{_ACTOR}.{key}")
    if own is None or own == actor:
        return actor, f"{_ACTOR}.{key}"
    return own, f"{_ROLLOUT}.{key}"


def _map_rollout(m: _VerlMap, tool: object) -> None:
    enable, enable_path = _inherited(m, "enable")
    if enable is True and _profiles(m):
        why = _rollout_unprofiled(m, tool)
        if why is not None:
            m.warnings.append(f"{why[0]}: {why[1]}, so the plan does not profile the rollout")
            enable = False
    elif enable is True:
        enable = False  # nothing profiled: said once, for global_profiler.tool
    m.put("rollout.enable", False if enable is None else enable, enable_path)
    m.put("rollout.start", "on_step", _ROLLOUT)  # verl starts the engines when the step begins
    all_ranks, all_path = _inherited(m, "all_ranks")
    if all_ranks is not None and not isinstance(all_ranks, bool):
        raise ConfigError(all_path, f"expected true or false, got {show_value(all_ranks)}")
    if all_ranks:
        m.put("rollout.replicas", "all", all_path)
    else:
        ranks, ranks_path = _inherited(m, "ranks")
        m.put("rollout.replicas", _replicas_of(m, ranks, ranks_path), ranks_path)
    window = f"{_ROLLOUT}.tool_config.{tool if tool in ('torch', 'npu') else 'torch'}"
    start, end = m.get(f"{window}.profile_token_start"), m.get(f"{window}.profile_token_end")
    delay = 0 if start is None else _verl_int(start, f"{window}.profile_token_start", minimum=0)
    forward_steps = None
    end_path = f"{window}.profile_token_end"
    if end is not None and _verl_int(end, end_path, minimum=0) != 0:  # 0: no end, as in verl
        forward_steps = _verl_int(end, end_path, minimum=0) - delay
        if forward_steps <= 0:
            raise ConfigError(end_path, f"must be > profile_token_start ({delay}), got {end}")
    m.put("rollout.delay", delay, f"{window}.profile_token_start")
    # An unset end is kept as null: "until the step ends", not aprof's default of 8.
    m.put("rollout.forward_steps", forward_steps, end_path, keep_none=True)


def _map_colocation(m: _VerlMap) -> None:
    """verl's hybrid engine (0.9.1's only layout, its default) runs every role on the GPUs of
    one pool, its rollout servers too: each role shares devices with every replica."""
    path = "actor_rollout_ref.hybrid_engine"
    hybrid = m.get(path)
    if hybrid is not None and not isinstance(hybrid, bool):
        raise ConfigError(path, f"expected true or false, got {show_value(hybrid)}")
    roles = list(m.data.get("roles", {}))
    if hybrid is False or not roles:
        return
    m.put("colocated", [{"role": role, "replicas": "all"} for role in roles], path)


def _rollout_unprofiled(m: _VerlMap, tool: object) -> tuple[str, str] | None:
    """Why verl would not profile its rollout servers (vLLM, SGLang) though enabled: the verl
    key and the reason; None when it would."""
    if tool not in ("torch", "npu"):
        # The rollout block's tool_config holds only torch and npu; the servers refuse nsys.
        what = show_value(tool)
        return (
            "global_profiler.tool",
            f"verl profiles the rollout only with torch or npu, not {what}",
        )
    discrete, path = _inherited(m, f"tool_config.{tool}.discrete")
    if discrete is True:
        return None
    return path, (
        f"{show_value(discrete)}: verl profiles the rollout only in discrete mode "
        f"(set {_ROLLOUT}.tool_config.{tool}.discrete=true to profile it)"
    )


def _replicas_of(m: _VerlMap, ranks: object, path: str) -> list[int]:
    """verl's rollout ranks are global GPU ranks; replica r owns [r*W, (r+1)*W)."""
    if ranks is None:
        ranks = []
    if not isinstance(ranks, list):
        raise ConfigError(path, f"expected a list, got {show_value(ranks)}")
    width = 1
    for size in (
        "tensor_model_parallel_size",
        "data_parallel_size",
        "pipeline_model_parallel_size",
    ):
        value = m.get(f"actor_rollout_ref.rollout.{size}")
        if value is not None:
            width *= _verl_int(value, f"actor_rollout_ref.rollout.{size}", minimum=1)
    owners = {_verl_int(rank, f"{path}[{i}]", minimum=0) // width for i, rank in enumerate(ranks)}
    return sorted(owners) or [0]


# ---------------------------------------------------------------------------------------------
# Overrides: verl's own profiler off, the servers' profiling routes kept
# ---------------------------------------------------------------------------------------------


def _overrides(m: _VerlMap, config: ProfilerConfig, tool: object) -> tuple[str, ...]:
    """Hydra overrides that leave aprof the only one driving captures.

    The rollout block (enable, ranks, discrete, tool) is left as it is: verl's servers decide at
    launch, from it alone, whether to start with the engine's profiler (and so its profiling
    routes), which aprof then drives.
    """
    # verl's trainers start and stop every profiler (worker groups and rollout servers) only on
    # the listed steps: with none, verl never drives a capture, and its finish hook never runs.
    overrides = ["global_profiler.steps=null"]
    if config.rollout.enable:
        window = f"{_ROLLOUT}.tool_config.{tool}"
        for key in ("profile_token_start", "profile_token_end"):
            # verl bakes its window into the server's launch (vLLM >= 0.13), where it bounds
            # every capture, aprof's too; aprof bounds its own (rollout.delay, forward_steps).
            if _find(m, f"{window}.{key}") is not None:
                overrides.append(f"{window}.{key}=null")
    return tuple(overrides)
