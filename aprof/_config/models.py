"""aprof's configuration as pydantic models, one per section."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from aprof._config.steps import MAX_INT, StepSelection, key_member, show_value
from aprof._config.types import (
    NPU_DEFAULT,
    TORCH_DEFAULT,
    NonNegativeInt,
    NPUContent,
    Pathname,
    PositiveInt,
    Seconds,
    Steps,
    StrictBool,
    TorchContent,
    distinct_nonempty,
    indices,
)
from aprof._errors import ConfigError
from aprof._layout import check_name

_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def _check_role_name(name: object, key: str) -> None:
    """Raise ``ConfigError`` at ``key`` unless ``name`` is a role name."""
    if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
        raise ConfigError(key, "role names may hold only letters, digits, '_' and '-'")


class _Model(BaseModel):
    """Base of every config section: unknown keys rejected, values immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        # `rollout:` with every child commented out reads as null in YAML: treat it as empty.
        if isinstance(data, Mapping):
            sections = {name for name, info in cls.model_fields.items() if _is_section(info)}
            return {k: {} if v is None and k in sections else v for k, v in data.items()}
        return data


def _is_section(info: FieldInfo) -> bool:
    annotation = info.annotation
    return get_origin(annotation) is dict or (
        isinstance(annotation, type) and issubclass(annotation, BaseModel)
    )


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class GlobalProfilerConfig(_Model):
    """Which steps are profiled, with which tool, and where the output goes."""

    tool: Literal["torch", "npu", "nsys", "torch_memory"] = Field(
        "torch", description="Capture tool of rollout servers and engine workers."
    )
    steps: Steps = Field(
        default_factory=StepSelection,
        description="Selected 1-based global steps: list, range string '1-3,5', {every: k}.",
    )
    save_path: Pathname = Field(
        Path("outputs/profile"), description="Root of every output (traces, manifest)."
    )
    continuous: StrictBool = Field(
        False,
        validation_alias=AliasChoices("continuous", "profile_continuous_steps"),
        description="Role windows span a run of consecutive selected steps.",
    )
    wait_for_stops: StrictBool = Field(
        False, description="A step's exit waits until its captures have stopped."
    )
    max_window_bytes: PositiveInt = Field(
        2 * 1024**3, description="A window whose files exceed this many bytes is flagged."
    )


class RolloutConfig(_Model):
    """Capture windows of the inference servers (per step and replica)."""

    enable: StrictBool = Field(True, description="Profile rollout replicas at all.")
    replicas: Annotated[list[int] | Literal["all"], BeforeValidator(indices("replica"))] = Field(
        default_factory=lambda: [0], description="Replica indices to profile, or 'all'."
    )
    start: Literal["on_first_request", "on_step"] = Field(
        "on_first_request", description="Open on the step's first request, or at step start."
    )
    delay: NonNegativeInt = Field(0, description="Engine forward steps skipped after start.")
    forward_steps: PositiveInt | None = Field(
        8, description="Engine forward steps captured; null = until the step ends."
    )

    def selects(self, replica: int) -> bool:
        """True if rollout profiling is enabled and `replica` is one of the profiled ones."""
        return self.enable and (self.replicas == "all" or replica in self.replicas)


class RoleConfig(_Model):
    """Captures of one engine-worker role (actor, ref, critic, ...)."""

    enable: StrictBool = Field(True, description="Profile this role at all.")
    all_ranks: StrictBool = Field(False, description="Profile every rank (ignores `ranks`).")
    ranks: Annotated[list[int], BeforeValidator(indices("rank"))] = Field(
        default_factory=lambda: [0], description="Ranks to profile; [] means rank 0."
    )
    discrete: StrictBool = Field(
        False, description="One capture per annotated stage instead of one per step."
    )

    @field_validator("ranks")
    @classmethod
    def _empty_is_rank_0(cls, ranks: list[int]) -> list[int]:
        # verl reads an empty rank list as rank 0; resolve it so printed configs say so.
        return ranks or [0]

    def selects(self, rank: int) -> bool:
        """True if this role is enabled and `rank` is one of its profiled ranks."""
        return self.enable and (self.all_ranks or rank in self.ranks)


class ColocatedConfig(_Model):
    """A role whose engine workers share accelerators with rollout replicas."""

    role: str = Field(description="The role, as `roles` names it.")
    replicas: Annotated[list[int] | Literal["all"], BeforeValidator(indices("replica"))] = Field(
        "all", description="The replicas on the role's devices, or 'all'."
    )
    exclusive: StrictBool | None = Field(
        None,
        description=(
            "Their captures never run at once: true, false, or null for the tool's default "
            "(true for npu and nsys, false for torch and torch_memory)."
        ),
    )

    @field_validator("role")
    @classmethod
    def _role_name(cls, role: str) -> str:
        _check_role_name(role, "")
        return role

    def holds(self, replica: int) -> bool:
        """True if ``replica`` is on this role's devices."""
        return self.replicas == "all" or replica in self.replicas

    def excludes(self, tools: tuple[str, str]) -> bool:
        """True if a capture of the role and one of its replicas, by ``tools``, may not run
        at once."""
        if self.exclusive is not None:
            return self.exclusive
        return any(tool in EXCLUSIVE_TOOLS for tool in tools)


EXCLUSIVE_TOOLS = frozenset({"npu", "nsys"})
"""Tools whose captures on one device lose data when another capture runs there (verl #7722:
NPU profiler data lost, nsys GPU metrics broken)."""


class ScheduleConfig(_Model):
    """A mini-batch schedule: which update mini-batches (``wp.step()`` calls) are recorded.

    After ``skip_first`` mini-batches, each cycle waits ``wait``, warms up ``warmup`` and
    records ``active`` mini-batches (one trace per cycle); ``repeat`` cycles, 0 = no limit.
    """

    skip_first: NonNegativeInt = Field(0, description="Mini-batches skipped once, at first.")
    wait: NonNegativeInt = Field(0, description="Mini-batches not recorded at each cycle start.")
    warmup: NonNegativeInt = Field(0, description="Mini-batches the profiler warms up in.")
    active: PositiveInt = Field(description="Mini-batches recorded per cycle (one trace).")
    repeat: NonNegativeInt = Field(0, description="Cycles per capture; 0 = until it ends.")
    stages: Annotated[list[str], AfterValidator(distinct_nonempty)] = Field(
        default_factory=lambda: ["actor_update"],
        description=(
            "Stages whose discrete captures follow the schedule (e2e: the whole step); "
            "default verl's update stage, actor_update."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _active_given(cls, data: Any) -> Any:
        # pydantic's "field required, got {...}" would not say what the key means.
        if isinstance(data, Mapping) and "active" not in data:
            raise ConfigError(".active", "required: the mini-batches recorded per cycle (> 0)")
        return data


class _Unscheduled(_Model):
    """A tool config that has no mini-batch schedule: a ``schedule`` key gets a clear error."""

    @model_validator(mode="before")
    @classmethod
    def _no_schedule(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "schedule" in data:
            raise ConfigError(
                ".schedule",
                "this tool has no mini-batch schedule; only tool_config.torch.schedule and "
                "tool_config.npu.schedule exist",
            )
        return data


class TorchToolConfig(_Model):
    """torch.profiler options."""

    contents: Annotated[list[TorchContent], AfterValidator(distinct_nonempty)] = Field(
        default_factory=lambda: list(TORCH_DEFAULT),
        description="Activities and extras: cpu, cuda, shapes, stack, memory.",
    )
    gzip: StrictBool = Field(True, description="Write traces as .json.gz.")
    schedule: ScheduleConfig | None = Field(
        None, description="Mini-batch schedule (torch.profiler.schedule); null = none."
    )


class NPUToolConfig(_Model):
    """torch_npu profiler options."""

    level: Literal["level_none", "level0", "level1", "level2"] = Field(
        "level0", description="Collection level."
    )
    contents: Annotated[list[NPUContent], AfterValidator(distinct_nonempty)] = Field(
        default_factory=lambda: list(NPU_DEFAULT),
        description="npu, cpu, memory, shapes, module, stack.",
    )
    analysis: StrictBool = Field(False, description="Parse the data right after capture.")
    schedule: ScheduleConfig | None = Field(
        None, description="Mini-batch schedule (torch_npu.profiler.schedule); null = none."
    )


NSYS_OWN_OPTIONS = ("trace", "output", "capture-range", "capture-range-end")
"""nsys options aprof sets itself (``trace`` from ``tool_config.nsys.trace``)."""
MAX_NSYS_OPTIONS = 64
_NSYS_OPTION = re.compile(r"[a-z][a-z0-9-]+")
_NSYS_VALUE = re.compile(r"\S+")


def _nsys_options(options: dict[str, str]) -> dict[str, str]:
    if len(options) > MAX_NSYS_OPTIONS:
        raise ConfigError("", f"at most {MAX_NSYS_OPTIONS} options, got {len(options)}")
    for name, value in options.items():
        if not _NSYS_OPTION.fullmatch(name):
            raise ConfigError(
                key_member(name),
                "expected an nsys long option name (lowercase letters, digits and '-', "
                "at least two characters, no leading '--')",
            )
        if name in NSYS_OWN_OPTIONS:
            raise ConfigError(
                key_member(name),
                f"set by aprof itself ({', '.join(NSYS_OWN_OPTIONS)}): list APIs in "
                "tool_config.nsys.trace, choose the folder with tool_config.nsys.output_dir; "
                "capture ranges are always cudaProfilerApi, each ended with 'repeat'",
            )
        if not _NSYS_VALUE.fullmatch(value):
            raise ConfigError(
                key_member(name), f"expected a value without whitespace, got {show_value(value)}"
            )
    return options


class NsysToolConfig(_Unscheduled):
    """Nsight Systems options."""

    trace: Annotated[list[str], AfterValidator(distinct_nonempty)] = Field(
        default_factory=lambda: ["cuda", "nvtx"], description="nsys --trace APIs."
    )
    output_dir: Pathname | None = Field(
        None, description="Where nsys writes reports; null = under save_path."
    )
    finalize_s: Seconds = Field(
        60.0,
        gt=0,
        le=86400,
        description="How long a stop waits for nsys to finish writing its report.",
    )
    options: Annotated[dict[str, Annotated[str, Strict()]], AfterValidator(_nsys_options)] = Field(
        default_factory=dict,
        description="Other nsys profile options, passed as --name=value "
        "(not trace, output, capture-range, capture-range-end).",
    )


class TorchMemoryToolConfig(_Unscheduled):
    """CUDA caching-allocator history options."""

    max_entries: PositiveInt = Field(100_000, description="Allocator events kept.")
    stack_depth: PositiveInt = Field(32, description="Frames recorded per event.")
    snapshot_on_oom: StrictBool = Field(False, description="Dump a snapshot on OOM.")
    context: Literal["state", "alloc", "all"] | None = Field(
        "all",
        description="Stack traces kept for: state (live blocks), alloc (+ alloc events), "
        "all (+ frees); null: none (torch's _record_memory_history context).",
    )
    stacks: Literal["python", "all"] = Field(
        "python",
        description="python: Python frames only (smaller snapshots; torch's default is all); "
        "all: also C++ and TorchScript frames.",
    )


class ToolConfig(_Model):
    """Per-tool options; only the selected tool's block is used."""

    torch: TorchToolConfig = Field(default_factory=TorchToolConfig)
    npu: NPUToolConfig = Field(default_factory=NPUToolConfig)
    nsys: NsysToolConfig = Field(default_factory=NsysToolConfig)
    torch_memory: TorchMemoryToolConfig = Field(default_factory=TorchMemoryToolConfig)


class TimeoutsConfig(_Model):
    """Bounds of every wait, in seconds, each within a range that keeps a run sane."""

    connect_s: Seconds = Field(5.0, ge=0.01, le=600, description="HTTP connect timeout.")
    start_s: Seconds = Field(
        30.0, ge=0.01, le=3600, description="Starting one capture; gated requests wait this."
    )
    # Flushing a huge trace takes minutes, never days.
    stop_s: Seconds = Field(
        600.0, ge=0.01, le=86400, description="Stopping one capture (flushing large traces)."
    )
    # Below 5 ms the poll loop floods a server with /metrics requests.
    poll_s: Seconds = Field(
        0.05, ge=0.005, le=60, description="Forward-step counter poll interval."
    )


class LimitsConfig(_Model):
    """Bounds on what aprof reads from the outside, in bytes."""

    answer_bytes: Annotated[int, Strict()] = Field(
        16 * 1024**2,
        ge=1024,
        le=1024**3,  # it is held in memory whole
        description="Largest answer read from a server; a longer one fails the call that got it.",
    )


class LogConfig(_Model):
    """aprof's own log output."""

    format: Literal["console", "json"] = Field("console", description="Console or JSON lines.")
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Threshold.")


def _path_safe(value: str | None) -> str | None:
    if value is not None:
        try:
            check_name(value, "the process name")
        except ValueError as exc:
            raise ConfigError("", str(exc)) from None
    return value


class TimelineConfig(_Model):
    """aprof's own spans (steps, requests, turns, tool calls, captures) as a Chrome trace."""

    enable: StrictBool = Field(True, description="Record the timeline at all.")
    buffer_events: Annotated[int, Strict()] = Field(
        200_000,
        gt=0,
        le=10_000_000,  # they are held in memory
        description="Spans kept between two writes (one step); more are dropped.",
    )
    process: Annotated[str | None, AfterValidator(_path_safe)] = Field(
        None, description="File name of this process's timeline; null = driver-<pid>."
    )


class ClusterConfig(_Model):
    """A run over several Ray nodes without shared storage: bringing their files home."""

    collect: Literal["off", "on_close"] = Field(
        "off",
        description="on_close: as the profiler closes, fetch every file of the run that other "
        "Ray nodes hold into save_path (aprof collect does it later).",
    )
    collect_s: Seconds = Field(
        600.0, ge=1, le=86400, description="Longest the collection at close may take."
    )


class _ServerConfig(_Model):
    """The bounds every HTTP server of the run (the control endpoint, the OTLP receiver) keeps
    on its clients."""

    header_s: Seconds = Field(
        5.0,
        ge=0.1,
        le=600,
        description="A request's line and headers arrive within this, or the connection is cut.",
    )
    body_s: Seconds = Field(
        10.0,
        ge=0.1,
        le=600,
        description="A request's body arrives within this of its headers, or gets 408, cut.",
    )
    max_connections: Annotated[int, Strict()] = Field(
        128,
        ge=1,
        le=4096,  # each holds a file descriptor of the training process
        description="Connections open at once; one more is closed as soon as it is accepted.",
    )


class ControlHTTPConfig(_ServerConfig):
    """The control endpoint on 127.0.0.1: ``POST /capture`` and ``GET /status``."""

    port: Annotated[int, Strict()] = Field(
        ge=0, le=65535, description="Port on 127.0.0.1; 0 = a free one (see control/endpoint.json)."
    )
    token_file: Pathname = Field(
        description="File holding the token a request must bear (Authorization: Bearer ...)."
    )


class ControlConfig(_Model):
    """Capture requests to a live run (``aprof capture``), read at step boundaries."""

    enable: StrictBool = Field(True, description="Read save_path/control/ at step boundaries.")
    http: ControlHTTPConfig | None = Field(
        None, description="Also take requests over HTTP on 127.0.0.1; null = off."
    )


class OtelConfig(_ServerConfig):
    """The OTLP/HTTP receiver of the servers' own request spans (``aprof/_otel``)."""

    receive: StrictBool = Field(
        False, description="Receive OTLP/HTTP trace exports at prof.otel_endpoint."
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        max_length=255,
        description="Address it listens on; another than 127.0.0.1 lets other machines send.",
    )
    port: Annotated[int, Strict()] = Field(0, ge=0, le=65535, description="0 = a free one.")
    token_file: Pathname | None = Field(
        None,
        description="File holding the token an export must bear (Authorization: Bearer ...); "
        "null = none asked (warned on another host than loopback).",
    )
    max_body_bytes: Annotated[int, Strict()] = Field(
        4 << 20,
        ge=1024,
        le=1 << 30,
        description="One export's body, sent and inflated; a larger one gets 413.",
    )
    max_spans_per_step: Annotated[int, Strict()] = Field(
        50_000, ge=1, le=10_000_000, description="Spans kept per step; the others are counted."
    )
    max_spans_per_body: Annotated[int, Strict()] = Field(
        8192,
        ge=1,
        le=1_000_000,
        description="Spans one export may hold (the OTel SDK sends at most 512); more get 413.",
    )
    detailed: StrictBool = Field(
        False, description="Servers launched for it: vLLM's --collect-detailed-traces all."
    )


class SlowTriggerConfig(_Model):
    """Capture the next steps when a step is slower than its recent past."""

    factor: Annotated[float, Strict(), Field(allow_inf_nan=False)] = Field(
        2.0, gt=1.0, le=1000.0, description="Slow means above factor x the baseline's median."
    )
    baseline_steps: Annotated[int, Strict()] = Field(
        20, ge=1, le=10_000, description="Unprofiled steps whose median is the baseline."
    )
    confirm: Annotated[int, Strict()] = Field(
        1, ge=1, le=1000, description="Consecutive slow steps before it fires."
    )
    cooldown_steps: Annotated[int, Strict()] = Field(
        50, ge=0, le=MAX_INT, description="Steps it stays quiet after its captures."
    )
    capture: Annotated[int, Strict()] = Field(
        1, ge=1, le=100, description="Steps captured when it fires."
    )


class TriggersConfig(_Model):
    """Captures a run asks for itself; null = off."""

    slow_step: SlowTriggerConfig | None = Field(
        None, description="On a step's wall time (entering to leaving it)."
    )
    slow_rollout: SlowTriggerConfig | None = Field(
        None, description="On a step's rollout time (its first request to its last answer)."
    )


class ProfilerConfig(_Model):
    """The whole aprof configuration."""

    global_profiler: GlobalProfilerConfig = Field(default_factory=GlobalProfilerConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    roles: dict[str, RoleConfig] = Field(
        default_factory=dict, description="Engine-worker roles by name ([A-Za-z0-9_-]+)."
    )
    tool_config: ToolConfig = Field(default_factory=ToolConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    timeline: TimelineConfig = Field(default_factory=TimelineConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)
    triggers: TriggersConfig = Field(default_factory=TriggersConfig)
    otel: OtelConfig = Field(default_factory=OtelConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    colocated: list[ColocatedConfig] = Field(
        default_factory=list, description="Roles that share accelerators with rollout replicas."
    )
    strict: StrictBool = Field(False, description="Let capture errors escape step/request.")

    @field_validator("roles", mode="before")
    @classmethod
    def _check_role_names(cls, roles: object) -> object:
        if not isinstance(roles, Mapping):
            return roles
        for name in roles:
            _check_role_name(name, key_member(name))
        # `actor:` with nothing under it reads as null: a role with default settings.
        return {name: {} if role is None else role for name, role in roles.items()}

    @field_validator("colocated")
    @classmethod
    def _one_entry_per_role(cls, colocated: list[ColocatedConfig]) -> list[ColocatedConfig]:
        seen: set[str] = set()
        for i, entry in enumerate(colocated):
            if entry.role in seen:
                raise ConfigError(f"[{i}].role", f"role {entry.role!r} is listed twice")
            seen.add(entry.role)
        return colocated

    def colocated_with(self, role: str) -> ColocatedConfig | None:
        """What ``colocated`` says of ``role``, if it names it."""
        return next((entry for entry in self.colocated if entry.role == role), None)

    def to_yaml(self) -> str:
        """The resolved configuration (every key, defaults included) as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)
