"""aprof's configuration: pydantic models, loading and readable errors (verl's: `_verl`)."""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePath
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from aprof._errors import ConfigError
from aprof._layout import check_name
from aprof._safe_files import FileTooLargeError, NotRegularFileError, read_regular
from aprof._steps import MAX_INT, StepSelection, is_int, key_member, show_value

MAX_CONFIG_BYTES = 1024**2
"""Largest config file (or YAML text) read: 1 MiB. verl's composed trainer configs are tens of
kB; YAML parsing in Python takes about 10 s per MiB on a slow core."""
MAX_ALIASES = 100
"""Most YAML aliases (`*name`) one config may use."""
MAX_VALUES = 1_000_000
"""Most values (scalars, lists, mappings) a config may hold once YAML aliases (and sub-objects
a mapping passed in shares) are expanded: a 526-byte alias bomb expands to 387 million."""
MAX_DEPTH = 100
"""Most levels a config may nest (aprof's own keys nest 5 deep, verl's about 8)."""
MAX_INT_DIGITS = 100
"""Most digits of an integer in a config file; Python's int() is slow on long ones and refuses
more than 4300."""

# ---------------------------------------------------------------------------------------------
# Field types
# ---------------------------------------------------------------------------------------------

# Strict: YAML already yields real ints and bools; `ranks: [true]` or `delay: 1.5` is a mistake.
StrictBool = Annotated[bool, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0, le=MAX_INT)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
# Each field gives its own range: `Field(default, ge=..., le=...)`.
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]


def _parse_steps(value: object) -> StepSelection:
    # key="" makes error keys relative ("[2]", ".every"); the converter prefixes the field path.
    return StepSelection.parse(value, key="")


Steps = Annotated[
    StepSelection,
    PlainValidator(_parse_steps),
    PlainSerializer(lambda steps: steps.to_config()),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "null"},
                {"type": "integer", "minimum": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 1}},
                {"type": "string", "examples": ["1-3,5"]},
                {"type": "object", "properties": {"every": {"type": "integer", "minimum": 1}}},
            ]
        }
    ),
]


def _path_text(value: object) -> object:
    if isinstance(value, str | PurePath):
        text = str(value)
        if not text.strip():
            raise ConfigError("", "must not be empty")
        # Either would pass here and fail later, when a file is created, with a raw error.
        if "\0" in text:
            raise ConfigError("", f"must not hold a NUL character, got {show_value(text)}")
        try:
            os.fsencode(text)
        except UnicodeEncodeError as exc:
            reason = f"{text[exc.start : exc.end]!r} cannot be in a file name here ({exc.reason})"
            raise ConfigError("", reason) from None
    return value


def _expand_home(path: Path) -> Path:
    # Without this, `~/prof` creates a folder named `~` in the working directory.
    try:
        return path.expanduser()
    except RuntimeError:  # `~name` of an unknown user, or no home at all
        raise ConfigError("", f"cannot find the home folder {path.parts[0]!r} stands for") from None


Pathname = Annotated[Path, BeforeValidator(_path_text), AfterValidator(_expand_home)]


def _indices(what: str) -> Callable[[object], object]:
    """A before-validator for a list of distinct indices >= 0 (ranks, replicas)."""

    def check(value: object) -> object:
        if what == "replica" and value == "all":
            return value
        if not isinstance(value, list | tuple):
            expected = "'all' or a list of replica indices" if what == "replica" else "a list"
            raise ConfigError("", f"expected {expected}, got {show_value(value)}")
        seen: set[int] = set()
        for i, item in enumerate(value):
            if not is_int(item) or item < 0:
                raise ConfigError(f"[{i}]", f"expected a {what} index >= 0, got {show_value(item)}")
            if item > MAX_INT:
                raise ConfigError(f"[{i}]", f"must be <= {MAX_INT}, got {show_value(item)}")
            if item in seen:
                raise ConfigError(f"[{i}]", f"{what} {item} is listed twice")
            seen.add(item)
        return list(value)

    return check


def _distinct_nonempty(values: list[str]) -> list[str]:
    if not values:
        raise ConfigError("", "must list at least one item")
    for i, value in enumerate(values):
        if value in values[:i]:
            raise ConfigError(f"[{i}]", f"{value!r} is listed twice")
    return values


TorchContent = Literal["cpu", "cuda", "shapes", "stack", "memory"]
NPUContent = Literal["npu", "cpu", "memory", "shapes", "module", "stack"]
TORCH_CONTENTS: tuple[TorchContent, ...] = get_args(TorchContent)
NPU_CONTENTS: tuple[NPUContent, ...] = get_args(NPUContent)
_TORCH_DEFAULT: tuple[TorchContent, ...] = ("cpu", "cuda")
_NPU_DEFAULT: tuple[NPUContent, ...] = ("npu", "cpu")
_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


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
    replicas: Annotated[list[int] | Literal["all"], BeforeValidator(_indices("replica"))] = Field(
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
    ranks: Annotated[list[int], BeforeValidator(_indices("rank"))] = Field(
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
    stages: Annotated[list[str], AfterValidator(_distinct_nonempty)] = Field(
        default_factory=lambda: ["update_actor"],
        description="Stages whose discrete captures follow the schedule (e2e: the whole step).",
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

    contents: Annotated[list[TorchContent], AfterValidator(_distinct_nonempty)] = Field(
        default_factory=lambda: list(_TORCH_DEFAULT),
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
    contents: Annotated[list[NPUContent], AfterValidator(_distinct_nonempty)] = Field(
        default_factory=lambda: list(_NPU_DEFAULT),
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

    trace: Annotated[list[str], AfterValidator(_distinct_nonempty)] = Field(
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
    strict: StrictBool = Field(False, description="Let capture errors escape step/request.")

    @field_validator("roles", mode="before")
    @classmethod
    def _check_role_names(cls, roles: object) -> object:
        if not isinstance(roles, Mapping):
            return roles
        for name in roles:
            if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name):
                raise ConfigError(
                    key_member(name), "role names may hold only letters, digits, '_' and '-'"
                )
        # `actor:` with nothing under it reads as null: a role with default settings.
        return {name: {} if role is None else role for name, role in roles.items()}

    def to_yaml(self) -> str:
        """The resolved configuration (every key, defaults included) as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

ConfigSource = str | os.PathLike[str] | Mapping[str, object] | ProfilerConfig | None


def load_config(source: ConfigSource = None) -> ProfilerConfig:
    """Load and validate a config from a file path, a mapping or YAML text.

    None or `{}` gives the defaults; a ProfilerConfig is returned as is. A `str` is a file
    path when it has no newline and the file exists or ends in .yaml/.yml/.json, else YAML.
    Raises ConfigError naming the key (or file) and the reason.
    """
    if isinstance(source, ProfilerConfig):
        return source
    data: object
    if source is None:
        data = {}
    elif isinstance(source, Mapping):
        data = to_plain(source)  # OmegaConf and other containers validate as dicts and lists do
    elif isinstance(source, os.PathLike):
        data = read_config_file(source)
    elif isinstance(source, str):
        data = read_config_file(source) if _is_path(source) else _parse_text(source)
    else:
        raise ConfigError(
            None, f"expected a file path, a mapping or YAML text, got {type(source).__name__}"
        )
    if data is None:  # an empty file or document
        data = {}
    if not isinstance(data, Mapping):
        plain_word = isinstance(source, str) and "\n" not in source
        hint = " (or the path of an existing file)" if plain_word else ""
        raise ConfigError(None, f"the top level must be a mapping{hint}, got {show_value(data)}")
    _not_verl(data)
    return _validate(data)


def _not_verl(data: Mapping[Any, Any]) -> None:
    """Raise ConfigError with the way to read it when `data` is a verl trainer config."""
    profiler = data.get("global_profiler")
    if isinstance(profiler, Mapping) and "_target_" in profiler:
        key = "global_profiler._target_"
    elif "actor_rollout_ref" in data:
        key = "actor_rollout_ref"
    else:
        return
    raise ConfigError(
        key,
        "a verl trainer config, not aprof's: read it with aprof.verl.load(cfg) "
        "(or aprof validate --verl / aprof launch-args --verl)",
    )


def _is_path(text: str) -> bool:
    if "\n" in text:
        return False
    # os.path.exists, not Path.exists: it answers False for over-long or NUL-holding names.
    return os.path.exists(text) or text.endswith((".yaml", ".yml", ".json"))


def _parse_text(text: str) -> object:
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            None, f"YAML text longer than {MAX_CONFIG_BYTES} characters (the limit of a config)"
        )
    return _parse_yaml(text, None)


def read_config_file(path: str | os.PathLike[str]) -> object:
    """The parsed content of a YAML or JSON file, as plain dicts and lists.

    Raises ConfigError naming the file if it is not a regular file, is larger than
    MAX_CONFIG_BYTES, cannot be parsed or exceeds a limit on its content (aliases, values,
    nesting, integer digits).
    """
    path = Path(path)
    # Errors name the file; one that would break the line is quoted.
    where = str(path) if str(path).isprintable() else repr(str(path))
    try:
        text = _read_bounded(path, where).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"not UTF-8 text ({exc.reason})") from None
    if path.suffix == ".json":
        return _parse_json(text, where)
    return _parse_yaml(text, where)


def _read_bounded(path: Path, where: str) -> bytes:
    """The bytes of a regular file of at most MAX_CONFIG_BYTES; ConfigError naming `where`."""
    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except ValueError:  # what os.open raises for a NUL in the name
        raise ConfigError(where, "cannot read: a file name cannot hold a NUL character") from None
    except FileTooLargeError:
        reason = f"larger than {MAX_CONFIG_BYTES} bytes (the limit of a config file)"
        raise ConfigError(where, reason) from None
    except NotRegularFileError as exc:
        raise ConfigError(where, str(exc.strerror)) from None
    except OSError as exc:
        raise ConfigError(where, f"cannot read: {exc.strerror or exc}") from None


def _parse_json(text: str, origin: str) -> object:
    try:
        data = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        reason = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        raise ConfigError(origin, reason) from None
    except ConfigError as exc:  # from the hooks, which do not know the file
        raise ConfigError(origin, f"invalid JSON: {exc.reason}") from None
    except RecursionError:
        raise ConfigError(origin, _too_deep()) from None  # as to_plain says it
    return to_plain(data, origin)


def _json_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # json.loads alone keeps the last value of a key given twice.
    data: dict[str, object] = {}
    for key, value in pairs:
        if key in data:
            raise ConfigError(None, f"key {key!r} given twice in one object")
        data[key] = value
    return data


def _json_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ConfigError(None, _too_long(digits))
    return int(text)


def _too_deep() -> str:
    return f"nested more than {MAX_DEPTH} levels deep (the limit of a config)"


def _too_long(digits: int) -> str:
    return f"an integer of {digits} digits (the limit of a config is {MAX_INT_DIGITS})"


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (yaml keeps the last), more than
    MAX_ALIASES aliases, nodes nested deeper than MAX_DEPTH and integers of more than
    MAX_INT_DIGITS digits."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # Checked while composing, before anything is expanded.
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped stub
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                limit = f"more than {MAX_ALIASES} aliases (the limit of a config)"
                raise yaml.composer.ComposerError(None, None, limit, mark)
        elif self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, _too_deep(), mark)
        self._depth += 1
        node = super().compose_node(parent, index)
        self._depth -= 1
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, IndexError, AttributeError):
            # What SafeLoader's scalar constructors raise on `!!int abc`, `!!bool x`, `!!float ''`,
            # `!!timestamp x` or the date 2001-02-30.
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            reason = f"not a valid {tag}: {show_value(node.value)}"
            raise yaml.constructor.ConstructorError(None, None, reason, node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        # Not a mapping node (`!!set [1]`): SafeLoader says so.
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key_node.value!r} given twice", key_node.start_mark
                    )
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = len(node.value.lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(None, None, _too_long(digits), node.start_mark)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def _parse_yaml(text: str, origin: str | None) -> object:
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["unreadable"])[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(origin, f"invalid YAML{where}: {problem}") from None
    return to_plain(data, origin)


def to_plain(value: object, origin: str | None = None) -> object:
    """OmegaConf containers (and any Mapping / Sequence) as plain dicts and lists.

    Raises ConfigError naming `origin` past MAX_VALUES values or MAX_DEPTH levels: a sub-object
    that appears several times (a YAML alias, a list shared in a mapping passed in) counts each
    time, and the walk stops at the limit instead of expanding everything first.
    """
    count = 0

    def walk(value: object, depth: int) -> object:
        nonlocal count
        count += 1
        if count > MAX_VALUES:
            reason = f"more than {MAX_VALUES} values with aliases expanded (the limit of a config)"
            raise ConfigError(origin, reason)
        if depth > MAX_DEPTH:
            raise ConfigError(origin, _too_deep())
        if isinstance(value, Mapping):
            return {k: walk(v, depth + 1) for k, v in value.items()}
        if isinstance(value, Sequence) and not isinstance(value, str | bytes):
            return [walk(v, depth + 1) for v in value]
        return value

    return walk(value, 1)


def _validate(data: Mapping[Any, Any]) -> ProfilerConfig:
    try:
        return ProfilerConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, ProfilerConfig) from None
    except (TypeError, KeyError, RecursionError) as exc:  # belt and braces: one error type out
        raise ConfigError(None, f"invalid configuration: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Readable errors
# ---------------------------------------------------------------------------------------------


def config_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    """One ConfigError for a ValidationError: its first error, plus how many more there are."""
    errors = exc.errors(include_url=False)
    if not errors:
        return ConfigError(None, str(exc))
    key, reason = _key_and_reason(errors[0], root)
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more)"
    return ConfigError(key or None, reason)


def _key_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        member = f"[{part}]" if isinstance(part, int) else key_member(part)
        path += member.removeprefix(".") if not path else member
    return path


def _key_and_reason(error: ErrorDetails, root: type[BaseModel]) -> tuple[str, str]:
    loc, kind, ctx = tuple(error["loc"]), error["type"], error.get("ctx") or {}
    got = show_value(error.get("input"))
    key = _key_path(loc)
    if kind == "value_error" and isinstance(ctx.get("error"), ConfigError):
        inner: ConfigError = ctx["error"]
        return key + (inner.key or ""), inner.reason
    if kind == "extra_forbidden":
        return key, _unknown_key(root, loc)
    if kind == "invalid_key":
        return _key_path(loc[:-1]), f"keys must be strings, got {got}"
    simple = {
        "greater_than": lambda: f"must be > {_bound(ctx, 'gt')}, got {got}",
        "greater_than_equal": lambda: f"must be >= {_bound(ctx, 'ge')}, got {got}",
        "less_than": lambda: f"must be < {_bound(ctx, 'lt')}, got {got}",
        "less_than_equal": lambda: f"must be <= {_bound(ctx, 'le')}, got {got}",
        "finite_number": lambda: f"must be a finite number, got {got}",
        "int_type": lambda: f"expected an integer, got {got}",
        "float_type": lambda: f"expected a number, got {got}",
        "bool_type": lambda: f"expected true or false, got {got}",
        "string_type": lambda: f"expected a string, got {got}",
        "list_type": lambda: f"expected a list, got {got}",
        "dict_type": lambda: f"expected a mapping, got {got}",
        "model_type": lambda: f"expected a mapping, got {got}",
        "model_attributes_type": lambda: f"expected a mapping, got {got}",
        "path_type": lambda: f"expected a path, got {got}",
        "literal_error": lambda: (
            f"expected one of {str(ctx.get('expected', '')).replace(' or ', ', ')}, got {got}"
        ),
    }
    if kind in simple:
        return key, simple[kind]()
    if kind == "value_error":
        return key, str(ctx.get("error", error["msg"]))
    msg = error["msg"]
    return key, f"{msg[:1].lower()}{msg[1:]}, got {got}"


def _bound(ctx: dict[str, Any], name: str) -> object:
    # Float fields report `gt=0.0`; "must be > 0" reads better.
    value = ctx.get(name)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _unknown_key(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    name = str(loc[-1]) if loc else ""
    fields = _fields_at(root, loc[:-1])
    if fields is None:
        return "unknown key"
    for field_name, info in fields.items():
        if (
            isinstance(info.validation_alias, AliasChoices)
            and name in info.validation_alias.choices
        ):
            return f"the same setting as '{field_name}'; give only one of them"
    allowed = list(fields)
    close = difflib.get_close_matches(name, allowed, n=1)
    if close:
        return f"unknown key; did you mean '{close[0]}'?"
    return "unknown key; expected one of " + ", ".join(repr(a) for a in allowed)


def _fields_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> dict[str, FieldInfo] | None:
    """The fields of the model found by walking `loc` down from `root`, if it is a model."""
    node: Any = root
    for part in loc:
        node = _unoptional(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            info = node.model_fields.get(str(part))
            if info is None:
                return None
            node = info.annotation
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return None
    node = _unoptional(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return dict(node.model_fields)
    return None


def _unoptional(node: Any) -> Any:
    """``X`` for an ``X | None`` annotation (an optional block), else ``node``."""
    if get_origin(node) in (Union, UnionType):
        args = [arg for arg in get_args(node) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return node
