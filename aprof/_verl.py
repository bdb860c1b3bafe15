"""The verl mapping: a verl trainer config (global_profiler + role profiler blocks) as aprof's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from aprof._config import (
    NPU_CONTENTS,
    TORCH_CONTENTS,
    ProfilerConfig,
    config_error,
    to_plain,
)
from aprof._errors import ConfigError
from aprof._steps import show_value

_ACTOR = "actor_rollout_ref.actor.profiler"
_ROLLOUT = "actor_rollout_ref.rollout.profiler"
_VERL_ROLES = {
    "actor": _ACTOR,
    "ref": "actor_rollout_ref.ref.profiler",
    "critic": "critic.profiler",
}
_NSYS = "global_profiler.global_tool_config.nsys"
_TORCH_MEMORY = "global_profiler.global_tool_config.torch_memory"


class _VerlMap:
    """Reads a verl config and builds aprof's config dict, remembering where each key came from."""

    def __init__(self, verl_cfg: Mapping[str, object]) -> None:
        self.verl = verl_cfg
        self.data: dict[str, Any] = {}
        self.origin: dict[str, str] = {}

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
        return to_plain(node)

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


def from_verl(verl_cfg: Mapping[str, object]) -> ProfilerConfig:
    """Map a verl trainer config (dict or OmegaConf DictConfig) onto aprof's config.

    Keys aprof does not map are ignored. Raises ConfigError naming the verl key path when a key
    aprof maps is malformed, or when `verl_cfg` is not a mapping.
    """
    if not isinstance(verl_cfg, Mapping):
        raise ConfigError(None, f"expected a verl config mapping, got {show_value(verl_cfg)}")
    m = _VerlMap(verl_cfg)
    try:
        _map_global(m)
        tool = m.data.get("global_profiler", {}).get("tool", "torch")
        for role, path in _VERL_ROLES.items():
            _map_role(m, role, path, tool)
        _map_tools(m)
        _map_schedule(m, tool)
        _map_rollout(m, tool)
        return ProfilerConfig.model_validate(m.data)
    except ValidationError as exc:
        raise m.translate(config_error(exc, ProfilerConfig)) from None
    except ConfigError as exc:
        raise m.translate(exc) from None
    except (TypeError, KeyError, AttributeError, RecursionError) as exc:  # one error type out
        raise ConfigError(None, f"invalid verl configuration: {exc}") from None


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
    trace = m.get(f"{_NSYS}.worker_nsight_options.trace")
    if isinstance(trace, str):  # nsys takes "cuda,nvtx,..."
        trace = [t.strip() for t in trace.split(",") if t.strip()]
    m.put("tool_config.nsys.trace", trace, f"{_NSYS}.worker_nsight_options.trace")
    for ours, theirs in (
        ("max_entries", "trace_alloc_max_entries"),
        ("stack_depth", "stack_depth"),
    ):
        path = f"{_TORCH_MEMORY}.{theirs}"
        m.put(f"tool_config.torch_memory.{ours}", m.get(path), path)


def _map_role(m: _VerlMap, role: str, path: str, tool: object) -> None:
    block = m.get(path)
    if block is None:
        return
    if not isinstance(block, Mapping):
        raise ConfigError(path, f"expected a mapping, got {show_value(block)}")
    m.put(f"roles.{role}", {}, path)
    # verl's role default is disabled, aprof's enabled: say it explicitly.
    enable = m.get(f"{path}.enable")
    m.put(f"roles.{role}.enable", False if enable is None else enable, f"{path}.enable")
    for key in ("all_ranks", "ranks"):
        m.put(f"roles.{role}.{key}", m.get(f"{path}.{key}"), f"{path}.{key}")
    discrete_path = f"{_NSYS}.discrete" if tool == "nsys" else f"{path}.tool_config.{tool}.discrete"
    discrete = m.get(discrete_path) if tool in ("nsys", "torch", "npu") else None
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
    if tool != "torch" or schedule is None:
        return
    if not isinstance(schedule, Mapping):
        raise ConfigError(path, f"expected a mapping, got {show_value(schedule)}")
    if m.get(f"{path}.active") in (None, 0):
        return
    m.put("tool_config.torch.schedule", {}, path)
    for key in ("skip_first", "wait", "warmup", "active", "repeat"):
        m.put(f"tool_config.torch.schedule.{key}", m.get(f"{path}.{key}"), f"{path}.{key}")


def _inherited(m: _VerlMap, key: str) -> tuple[object, str]:
    """A rollout profiler key, or the actor's when unset (verl's interpolation default)."""
    own = m.get(f"{_ROLLOUT}.{key}")
    if own is not None:
        return own, f"{_ROLLOUT}.{key}"
    return m.get(f"{_ACTOR}.{key}"), f"{_ACTOR}.{key}"


def _map_rollout(m: _VerlMap, tool: object) -> None:
    enable, enable_path = _inherited(m, "enable")
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
    if end is not None:
        end_path = f"{window}.profile_token_end"
        forward_steps = _verl_int(end, end_path, minimum=0) - delay
        if forward_steps <= 0:
            raise ConfigError(end_path, f"must be > profile_token_start ({delay}), got {end}")
    m.put("rollout.delay", delay, f"{window}.profile_token_start")
    # An unset end is kept as null: "until the step ends", not aprof's default of 8.
    m.put("rollout.forward_steps", forward_steps, f"{window}.profile_token_end", keep_none=True)


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
