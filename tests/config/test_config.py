"""Configuration: defaults, loading, readable errors, YAML round trip and the verl mapping."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import pickle
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import aprof
import aprof.verl
from aprof._config import ProfilerConfig, RoleConfig, RolloutConfig, StepSelection, load_config
from aprof._config.reading import (
    MAX_ALIASES,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_VALUES,
)
from aprof._errors import MAX_DESCRIBED, ConfigError, describe
from aprof.verl._config import map_verl


def error_of(source: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source)  # type: ignore[arg-type]
    return info.value


# --- defaults ------------------------------------------------------------------------------


def test_defaults_keep_data_small() -> None:
    cfg = load_config()
    assert cfg == load_config({}) == ProfilerConfig()
    gp = cfg.global_profiler
    assert gp.tool == "torch"
    assert gp.steps.is_empty
    assert gp.save_path == Path("outputs/profile")
    assert gp.continuous is False and gp.wait_for_stops is False
    assert gp.max_window_bytes == 2 * 1024**3
    assert cfg.rollout.enable is True
    assert cfg.rollout.replicas == [0]
    assert cfg.rollout.start == "on_first_request"
    assert (cfg.rollout.delay, cfg.rollout.forward_steps) == (0, 8)
    assert cfg.roles == {}
    assert RoleConfig().ranks == [0] and RoleConfig().all_ranks is False
    assert RoleConfig().discrete is False
    torch = cfg.tool_config.torch
    assert torch.contents == ["cpu", "cuda"] and torch.gzip is True
    npu = cfg.tool_config.npu
    assert (npu.level, npu.contents, npu.analysis) == ("level0", ["npu", "cpu"], False)
    assert cfg.tool_config.nsys.trace == ["cuda", "nvtx"]
    assert cfg.tool_config.nsys.output_dir is None
    mem = cfg.tool_config.torch_memory
    assert (mem.max_entries, mem.stack_depth, mem.snapshot_on_oom) == (100_000, 32, False)
    t = cfg.timeouts
    assert (t.connect_s, t.start_s, t.stop_s, t.poll_s) == (5, 30, 600, 0.05)
    assert (cfg.log.format, cfg.log.level) == ("console", "info")
    assert cfg.strict is False


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(ValidationError):
        cfg.strict = True  # type: ignore[misc]


# --- sources -------------------------------------------------------------------------------

SAMPLE = """\
global_profiler: {tool: torch, steps: "1-3,5", save_path: /tmp/prof, continuous: true}
rollout: {replicas: all, start: on_step, delay: 2, forward_steps: null}
roles:
  actor: {ranks: [0, 1], discrete: true}
  critic:
tool_config:
  torch: {contents: [cpu, cuda, stack]}
timeouts: {stop_s: 60}
"""


def check_sample(cfg: ProfilerConfig) -> None:
    assert cfg.global_profiler.steps == StepSelection.parse([1, 2, 3, 5])
    assert cfg.global_profiler.save_path == Path("/tmp/prof")
    assert cfg.global_profiler.continuous is True
    assert cfg.rollout.replicas == "all"
    assert cfg.rollout.start == "on_step"
    assert (cfg.rollout.delay, cfg.rollout.forward_steps) == (2, None)
    assert cfg.roles["actor"] == RoleConfig(ranks=[0, 1], discrete=True)
    assert cfg.roles["critic"] == RoleConfig()
    assert cfg.tool_config.torch.contents == ["cpu", "cuda", "stack"]
    assert cfg.timeouts.stop_s == 60


class Unreadable(Mapping[str, object]):
    """A mapping of another library whose value at `bad` cannot be read."""

    def __init__(self, data: dict[str, object], bad: str) -> None:
        self.data, self.bad = data, bad

    def __getitem__(self, key: str) -> object:
        if key == self.bad:
            raise LookupError(f"{key} cannot be given\nsecond line")
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


def test_a_value_a_container_cannot_give_is_one_error_naming_its_key() -> None:
    inner = Unreadable({"steps": [1], "save_path": "/tmp/p"}, "save_path")
    err = error_of({"global_profiler": inner})
    assert err.key == "global_profiler.save_path"
    assert err.reason == "cannot be read: LookupError: save_path cannot be given"
    assert error_of(Unreadable({"rollout": {}}, "rollout")).key == "rollout"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"global_profiler": {"steps": [1], "save_path": "???"}}, "global_profiler.save_path"),
        ({"global_profiler": {"steps": [1, "???"]}}, "global_profiler.steps[1]"),
        ({"global_profiler": {"save_path": "${nowhere}"}}, "global_profiler.save_path"),
        ({"global_profiler": "???"}, "global_profiler"),
        ({"roles": {"actor": {"ranks": ["${roles.x}"]}}}, "roles.actor.ranks[0]"),
    ],
)
def test_a_value_omegaconf_cannot_give_is_one_error_naming_its_key(
    data: dict[str, Any], key: str
) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    err = error_of(omegaconf.OmegaConf.create(data))
    assert err.key == key and err.reason.startswith("cannot be read: ")
    assert "\n" not in str(err)


def test_an_omegaconf_config_loads_as_its_plain_data_does() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    data = {"global_profiler": {"steps": [2, 3]}, "rollout": {"delay": 3, "forward_steps": 5}}
    interpolated = copy.deepcopy(data)
    interpolated["rollout"]["forward_steps"] = "${global_profiler.steps[1]}"
    assert load_config(omegaconf.OmegaConf.create(interpolated)).rollout.forward_steps == 3
    assert load_config(omegaconf.OmegaConf.create(data)) == load_config(data)


def test_load_yaml_text() -> None:
    check_sample(load_config(SAMPLE))


def test_load_dict() -> None:
    check_sample(load_config(yaml.safe_load(SAMPLE)))


def test_load_file_by_str_and_path(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(SAMPLE)
    check_sample(load_config(str(path)))
    check_sample(load_config(path))


def test_load_existing_file_without_suffix(tmp_path: Path) -> None:
    path = tmp_path / "profile"
    path.write_text(SAMPLE)
    check_sample(load_config(str(path)))


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(yaml.safe_load(SAMPLE), indent="\t"))
    check_sample(load_config(path))


def test_config_is_returned_as_is() -> None:
    cfg = load_config(SAMPLE)
    assert load_config(cfg) is cfg


def test_empty_document_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert load_config(path) == ProfilerConfig()


def test_missing_file_names_path_and_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    for source in (str(missing), missing):
        err = error_of(source)
        assert err.key == str(missing)
        assert "No such file or directory" in err.reason


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    err = error_of(tmp_path)
    assert err.key == str(tmp_path)
    assert "directory" in err.reason.lower()


def test_broken_yaml_reports_line(tmp_path: Path) -> None:
    text = "global_profiler:\n  tool: torch\n  steps: [1, 2\nrollout: {}\n"
    err = error_of(text)
    assert "invalid YAML at line 4" in err.reason
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    err = error_of(path)
    assert err.key == str(path) and "line 4" in err.reason


def test_broken_json_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{\n  "rollout": {\n    "delay": 1,,\n  }\n}\n')
    err = error_of(path)
    assert err.key == str(path) and "invalid JSON at line 3" in err.reason


def test_duplicate_yaml_key_rejected() -> None:
    err = error_of("rollout:\n  delay: 1\n  delay: 2\n")
    assert "line 3" in err.reason and "'delay' given twice" in err.reason


@pytest.mark.parametrize("source", ["- 1\n- 2\n", "just words", 42, [1, 2]])
def test_top_level_must_be_a_mapping(source: object) -> None:
    err = error_of(source)
    assert err.key is None
    assert "mapping" in err.reason


# --- readable validation errors ------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        ({"rollout": {"forwrd_steps": 3}}, "rollout.forwrd_steps", "did you mean 'forward_steps'?"),
        ({"rolout": {}}, "rolout", "did you mean 'rollout'?"),
        ({"roles": {"actor": {"rnks": [0]}}}, "roles.actor.rnks", "did you mean 'ranks'?"),
        (
            {"tool_config": {"torch": {"schedule": {"active": 1, "wiat": 1}}}},
            "tool_config.torch.schedule.wiat",
            "did you mean 'wait'?",  # inside an optional block
        ),
        ({"zzz": 1}, "zzz", "unknown key; expected one of 'global_profiler'"),
        ({"rollout": {"forward_steps": -1}}, "rollout.forward_steps", "must be > 0, got -1"),
        ({"rollout": {"delay": -1}}, "rollout.delay", "must be >= 0, got -1"),
        ({"rollout": {"delay": 1.5}}, "rollout.delay", "expected an integer, got 1.5"),
        (
            {"rollout": {"start": "first"}},
            "rollout.start",
            "expected one of 'on_first_request', 'on_step', got 'first'",
        ),
        ({"rollout": {"replicas": [0, 0]}}, "rollout.replicas[1]", "listed twice"),
        ({"rollout": {"replicas": [0, -1]}}, "rollout.replicas[1]", ">= 0, got -1"),
        ({"rollout": {"replicas": [True]}}, "rollout.replicas[0]", "got true"),
        ({"rollout": {"replicas": "some"}}, "rollout.replicas", "'all' or a list"),
        ({"rollout": {"enable": "yes"}}, "rollout.enable", "expected true or false"),
        ({"rollout": [1]}, "rollout", "expected a mapping"),
        ({"global_profiler": {"steps": [1, 0]}}, "global_profiler.steps[1]", "positive"),
        ({"global_profiler": {"steps": "3-1"}}, "global_profiler.steps", "reversed range"),
        ({"global_profiler": {"steps": {"every": 0}}}, "global_profiler.steps.every", "positive"),
        ({"global_profiler": {"tool": "perf"}}, "global_profiler.tool", "expected one of"),
        ({"global_profiler": {"save_path": " "}}, "global_profiler.save_path", "not be empty"),
        ({"global_profiler": {"max_window_bytes": 0}}, "global_profiler.max_window_bytes", "> 0"),
        (
            {"global_profiler": {"continuous": True, "profile_continuous_steps": True}},
            "global_profiler.profile_continuous_steps",
            "give only one",
        ),
        ({"roles": {"my actor": {}}}, "roles.my actor", "role names"),
        ({"roles": {"a/b": {}}}, "roles.a/b", "role names"),
        ({"roles": {"actor": {"ranks": [1, 1]}}}, "roles.actor.ranks[1]", "listed twice"),
        ({"roles": [1]}, "roles", "expected a mapping"),
        (
            {"tool_config": {"torch": {"contents": ["cpu", "gpu"]}}},
            "tool_config.torch.contents[1]",
            "got 'gpu'",
        ),
        ({"tool_config": {"torch": {"contents": []}}}, "tool_config.torch.contents", "at least"),
        (
            {"tool_config": {"npu": {"contents": ["npu", "npu"]}}},
            "tool_config.npu.contents[1]",
            "twice",
        ),
        ({"tool_config": {"npu": {"level": "level3"}}}, "tool_config.npu.level", "expected one of"),
        (
            {"tool_config": {"torch_memory": {"stack_depth": 0}}},
            "tool_config.torch_memory.stack_depth",
            "> 0",
        ),
        ({"log": {"level": "loud"}}, "log.level", "expected one of"),
        ({"strict": "no"}, "strict", "expected true or false"),
        ({"colocated": {"role": "actor"}}, "colocated", "expected a list"),
        ({"colocated": [{"replicas": [0]}]}, "colocated[0].role", "required"),
        ({"colocated": [{"role": "my actor"}]}, "colocated[0].role", "role names"),
        ({"colocated": [{"role": "a", "replicas": [1, 1]}]}, "colocated[0].replicas[1]", "twice"),
        ({"colocated": [{"role": "a", "exclusive": "yes"}]}, "colocated[0].exclusive", "true or"),
        ({"colocated": [{"role": "a"}, {"role": "a"}]}, "colocated[1].role", "listed twice"),
        ({"colocated": [{"role": "a", "devices": [0]}]}, "colocated[0].devices", "unknown key"),
    ],
)
def test_errors_name_key_and_reason(data: dict[str, Any], key: str, reason: str) -> None:
    err = error_of(data)
    assert err.key == key
    assert reason in err.reason
    assert str(err) == f"{key}: {err.reason}"


@pytest.mark.parametrize("name", ["connect_s", "start_s", "stop_s", "poll_s"])
@pytest.mark.parametrize("value", [0, -1, -0.5, 0.0, math.inf, math.nan, True, "5"])
def test_each_timeout_must_be_positive_and_finite(name: str, value: object) -> None:
    err = error_of({"timeouts": {name: value}})
    assert err.key == f"timeouts.{name}"


def test_timeouts_accept_ints_and_floats() -> None:
    cfg = load_config({"timeouts": {"connect_s": 1, "poll_s": 0.01}})
    assert cfg.timeouts.connect_s == 1.0 and cfg.timeouts.poll_s == 0.01


TIMEOUT_RANGES = [
    ("connect_s", 0.01, 600),
    ("start_s", 0.01, 3600),
    ("stop_s", 0.01, 86400),
    ("poll_s", 0.005, 60),
]


@pytest.mark.parametrize(("name", "low", "high"), TIMEOUT_RANGES)
def test_each_timeout_has_a_range(name: str, low: float, high: float) -> None:
    cfg = load_config({"timeouts": {name: low}})
    assert getattr(cfg.timeouts, name) == low
    assert getattr(load_config({"timeouts": {name: high}}).timeouts, name) == high
    for value, reason in [
        (low / 2, f"must be >= {low}, got {low / 2!r}"),
        (1e-300, f"must be >= {low}, got 1e-300"),
        (high + 1, f"must be <= {high}, got {high + 1!r}"),
        (1e300, f"must be <= {high}, got 1e+300"),
    ]:
        assert str(error_of({"timeouts": {name: value}})) == f"timeouts.{name}: {reason}"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"limits": {"answer_bytes": 1023}}, "limits.answer_bytes: must be >= 1024, got 1023"),
        (
            {"limits": {"answer_bytes": 2**30 + 1}},
            "limits.answer_bytes: must be <= 1073741824, got 1073741825",
        ),
        (
            {"timeline": {"buffer_events": 10_000_001}},
            "timeline.buffer_events: must be <= 10000000, got 10000001",
        ),
        (
            {"tool_config": {"nsys": {"finalize_s": 1e300}}},
            "tool_config.nsys.finalize_s: must be <= 86400, got 1e+300",
        ),
        (
            {"rollout": {"delay": 2**63}},
            "rollout.delay: must be <= 9223372036854775807, got 9223372036854775808",
        ),
        (
            {"global_profiler": {"max_window_bytes": 10**5000}},
            "global_profiler.max_window_bytes: must be <= 9223372036854775807, "
            "got an integer of more than 40 digits",
        ),
        (
            {"global_profiler": {"steps": [1, 2**63]}},
            "global_profiler.steps[1]: must be <= 9223372036854775807, got 9223372036854775808",
        ),
        (
            {"global_profiler": {"steps": {"every": -(10**5000)}}},
            "global_profiler.steps.every: must be a positive integer (steps are 1-based), "
            "got an integer of more than 40 digits",
        ),
        (
            {"roles": {"actor": {"ranks": [2**63]}}},
            "roles.actor.ranks[0]: must be <= 9223372036854775807, got 9223372036854775808",
        ),
    ],
)
def test_numbers_have_sane_upper_bounds(data: dict[str, Any], message: str) -> None:
    assert str(error_of(data)) == message


def test_bounds_themselves_are_accepted() -> None:
    cfg = load_config(
        {
            "limits": {"answer_bytes": 1024},
            "timeline": {"buffer_events": 10_000_000},
            "rollout": {"delay": 2**63 - 1, "replicas": [2**63 - 1]},
            "global_profiler": {"steps": [2**63 - 1]},
        }
    )
    assert cfg.limits.answer_bytes == 1024 and cfg.rollout.delay == 2**63 - 1
    assert load_config(cfg.to_yaml()) == cfg
    assert load_config({"limits": {"answer_bytes": 2**30}}).limits.answer_bytes == 2**30


# --- paths -------------------------------------------------------------------------------------


def nested(key: str, value: object) -> dict[str, Any]:
    """`{"a": {"b": value}}` for the key "a.b"."""
    data: Any = value
    for part in reversed(key.split(".")):
        data = {part: data}
    return dict(data)


@pytest.mark.parametrize("key", ["global_profiler.save_path", "tool_config.nsys.output_dir"])
def test_paths_no_file_can_have_rejected(key: str) -> None:
    err = error_of(nested(key, "out/a\0b"))
    assert str(err) == f"{key}: must not hold a NUL character, got 'out/a\\x00b'"
    err = error_of(nested(key, "out/\ud800"))  # a lone surrogate (JSON's "\ud800")
    assert str(err) == f"{key}: '\\ud800' cannot be in a file name here (surrogates not allowed)"
    load_config(nested(key, "out/ab"))


def test_paths_expand_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(
        {"global_profiler": {"save_path": "~/prof"}, "tool_config": {"nsys": {"output_dir": "~"}}}
    )
    assert cfg.global_profiler.save_path == tmp_path / "prof"
    assert cfg.tool_config.nsys.output_dir == tmp_path
    assert load_config({"global_profiler": {"save_path": "a~/b"}}).global_profiler.save_path == (
        Path("a~/b")
    )
    err = error_of({"global_profiler": {"save_path": "~no-such-user-aprof/prof"}})
    assert str(err) == (
        "global_profiler.save_path: cannot find the home folder '~no-such-user-aprof' stands for"
    )


def test_several_errors_counted() -> None:
    err = error_of({"rollout": {"delay": -1, "forward_steps": 0}, "timeouts": {"stop_s": 0}})
    assert err.key == "rollout.delay"
    assert err.reason.endswith("(and 2 more)")


def test_config_error_pickles() -> None:
    err = error_of({"rollout": {"delay": -1}})
    again = pickle.loads(pickle.dumps(err))
    assert (again.key, again.reason, str(again)) == (err.key, err.reason, str(err))
    assert str(ConfigError(None, "bad")) == "bad"


# --- describe: a failure in one line, as the manifest and LLMError hold it --------------------


def test_describe_gives_type_and_message_on_one_line() -> None:
    assert describe(RuntimeError("disk\n  full\t now")) == "RuntimeError: disk full now"
    assert describe(TimeoutError()) == "TimeoutError"
    assert describe(ValueError(" \n ")) == "ValueError"


def test_describe_cuts_the_middle_of_a_long_message() -> None:
    text = describe(OSError("start " + "x" * 5000 + " the end"))
    assert len(text) == len("OSError: ") + MAX_DESCRIBED
    assert text.startswith("OSError: start xxx") and text.endswith("xxx the end")
    assert " ... " in text


def test_describe_names_what_a_ray_task_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    class RayTaskError(Exception):  # what Ray raises for a remote exception
        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::Worker.begin() (pid=1)\n  File ...\nRuntimeError: boom")
            self.cause = cause

    fake = types.ModuleType("ray.exceptions")
    fake.RayTaskError = RayTaskError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray.exceptions", fake)
    assert describe(RayTaskError(RuntimeError("boom"))) == "RuntimeError: boom"
    assert describe(RuntimeError("boom")) == "RuntimeError: boom"


# --- semantics of the models ---------------------------------------------------------------


def test_replicas_all_and_list() -> None:
    every = load_config({"rollout": {"replicas": "all"}}).rollout
    assert every.replicas == "all"
    assert every.selects(0) and every.selects(17)
    some = load_config({"rollout": {"replicas": [2, 0]}}).rollout
    assert some.replicas == [2, 0]
    assert some.selects(0) and some.selects(2) and not some.selects(1)
    assert not RolloutConfig(enable=False).selects(0)


def test_roles() -> None:
    cfg = load_config({"roles": {"actor": {"ranks": []}, "critic-2": {"all_ranks": True}}})
    assert cfg.roles["actor"].ranks == [0]  # verl: an empty list means rank 0
    assert cfg.roles["actor"].selects(0) and not cfg.roles["actor"].selects(1)
    assert cfg.roles["critic-2"].selects(7)
    assert not RoleConfig(enable=False).selects(0)


def test_verl_alias_for_continuous() -> None:
    cfg = load_config({"global_profiler": {"profile_continuous_steps": True}})
    assert cfg.global_profiler.continuous is True
    assert "profile_continuous_steps" not in cfg.to_yaml()


def test_null_sections_are_empty() -> None:
    assert load_config("rollout:\ntimeouts:\nroles:\n") == ProfilerConfig()


# --- to_yaml -------------------------------------------------------------------------------


def test_to_yaml_round_trip() -> None:
    cfg = load_config(SAMPLE)
    text = cfg.to_yaml()
    data = yaml.safe_load(text)
    assert data["global_profiler"]["steps"] == [1, 2, 3, 5]
    assert data["global_profiler"]["save_path"] == "/tmp/prof"
    assert data["timeouts"]["poll_s"] == 0.05  # defaults included
    assert data["roles"]["critic"] == {
        "enable": True,
        "all_ranks": False,
        "ranks": [0],
        "discrete": False,
    }
    assert load_config(text) == cfg
    assert load_config(ProfilerConfig().to_yaml()) == ProfilerConfig()
    every = load_config({"global_profiler": {"steps": {"every": 4}}})
    assert yaml.safe_load(every.to_yaml())["global_profiler"]["steps"] == {"every": 4}
    assert load_config(every.to_yaml()) == every


valid_configs = st.fixed_dictionaries(
    {},
    optional={
        "global_profiler": st.fixed_dictionaries(
            {},
            optional={
                "tool": st.sampled_from(["torch", "npu", "nsys", "torch_memory"]),
                "steps": st.one_of(
                    st.none(),
                    st.lists(st.integers(1, 50), unique=True, max_size=8),
                    st.builds(lambda k: {"every": k}, st.integers(1, 9)),
                ),
                "save_path": st.sampled_from(["out", "a b/c", "1.0", "/tmp/x", "yes"]),
                "continuous": st.booleans(),
            },
        ),
        "rollout": st.fixed_dictionaries(
            {},
            optional={
                "replicas": st.one_of(
                    st.just("all"), st.lists(st.integers(0, 9), unique=True, max_size=4)
                ),
                "forward_steps": st.one_of(st.none(), st.integers(1, 100)),
                "delay": st.integers(0, 10),
            },
        ),
        "roles": st.dictionaries(
            st.sampled_from(["actor", "ref", "critic", "reward_model"]),
            st.fixed_dictionaries({}, optional={"ranks": st.lists(st.integers(0, 7), unique=True)}),
        ),
        "timeouts": st.fixed_dictionaries(
            {}, optional={"poll_s": st.floats(0.005, 60), "stop_s": st.integers(1, 10_000)}
        ),
    },
)


@given(valid_configs)
def test_to_yaml_round_trip_property(data: dict[str, Any]) -> None:
    cfg = load_config(data)
    assert load_config(cfg.to_yaml()) == cfg


# --- fuzzing: ConfigError or a config, nothing else ----------------------------------------

FIELD_NAMES = [
    "global_profiler", "rollout", "roles", "tool_config", "timeouts", "log", "strict",
    "tool", "steps", "save_path", "continuous", "profile_continuous_steps", "wait_for_stops",
    "max_window_bytes", "enable", "replicas", "start", "delay", "forward_steps", "all_ranks",
    "ranks", "discrete", "torch", "npu", "nsys", "torch_memory", "contents", "gzip", "level",
    "analysis", "trace", "output_dir", "max_entries", "stack_depth", "snapshot_on_oom",
    "connect_s", "start_s", "stop_s", "poll_s", "format", "every", "actor",
]  # fmt: skip
SPECIAL_VALUES = [
    "all", "1-3,5", "3-1", "1,,2", "on_step", "on_first_request", "cpu", "cuda", "level0",
    "torch", "json", "", " ", "\n", "x" * 300, [], {}, {"every": 2}, {"every": 0}, [0], [1, 1],
    ["cpu", "cpu"], float("nan"), float("inf"), -1, 0, 1, 2**70, -(2**70), True, None,
]  # fmt: skip

leaves = st.one_of(
    st.sampled_from(SPECIAL_VALUES),
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8), st.integers(-2, 2))
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=25,
)
configs = st.dictionaries(st.sampled_from(FIELD_NAMES[:7]), trees, max_size=5)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(configs, st.dictionaries(keys, trees, max_size=4)))
def test_any_mapping_loads_or_raises_config_error(data: dict[Any, Any]) -> None:
    try:
        cfg = load_config(data)
    except ConfigError as err:
        assert err.reason
    else:
        assert load_config(cfg.to_yaml()) == cfg


@settings(max_examples=200)
@given(configs)
def test_any_yaml_text_loads_or_raises_config_error(data: dict[Any, Any]) -> None:
    try:
        text = yaml.safe_dump(data)
    except yaml.YAMLError:
        return
    with contextlib.suppress(ConfigError):
        load_config("\n" + text)


@settings(max_examples=200)
@given(st.text(max_size=80))
def test_any_text_loads_or_raises_config_error(text: str) -> None:
    with contextlib.suppress(ConfigError):
        load_config("\n" + text)  # the newline makes it YAML text, never a path


# --- hostile input: bounded loading, one line per error -----------------------------------------


def alias_bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML: each level lists the level above it 9 times (9**levels values)."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def nest(depth: int, mappings: bool = False) -> object:
    """0 inside `depth` nested lists or single-key mappings, built without recursion."""
    value: object = 0
    for _ in range(depth):
        value = {"a": value} if mappings else [value]
    return value


TOO_DEEP = "nested more than 100 levels deep (the limit of a config)"
TOO_MANY = "more than 1000000 values with aliases expanded (the limit of a config)"


def test_limits() -> None:
    assert MAX_CONFIG_BYTES == 1024**2
    assert (MAX_ALIASES, MAX_VALUES, MAX_DEPTH, MAX_INT_DIGITS) == (100, 1_000_000, 100, 100)


def test_file_size_is_limited(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# padding\n" * (MAX_CONFIG_BYTES // 10 - 1) + "strict: true\n")
    size = path.stat().st_size
    assert size <= MAX_CONFIG_BYTES
    assert load_config(path).strict is True
    with path.open("a") as file:
        file.write("#" * (MAX_CONFIG_BYTES + 1 - size))
    assert str(error_of(path)) == f"{path}: larger than 1048576 bytes (the limit of a config file)"
    err = error_of("\n" + "#" * MAX_CONFIG_BYTES)
    assert str(err) == "YAML text longer than 1048576 characters (the limit of a config)"


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    # A FIFO and /dev/zero are tested through `aprof validate`: before the check they hang or
    # fill the memory, which a subprocess can be timed out of.
    assert (
        str(error_of(Path(os.devnull))) == f"{os.devnull}: not a regular file: a character device"
    )
    assert str(error_of(tmp_path)) == f"{tmp_path}: not a regular file: a directory"


def test_file_names_that_would_break_the_line_are_quoted(tmp_path: Path) -> None:
    err = error_of("a\0b.yaml")  # os.open raises ValueError for it
    assert str(err) == "'a\\x00b.yaml': cannot read: a file name cannot hold a NUL character"
    path = tmp_path / "a\nb.yaml"
    path.write_text("rollout: [\n")
    assert str(error_of(path)).startswith(f"{str(path)!r}: invalid YAML at line 2")


def test_yaml_alias_limit(tmp_path: Path) -> None:
    def roles(aliases: int) -> str:
        return "roles:\n  actor: &r {ranks: [1]}\n" + "".join(
            f"  r{i}: *r\n" for i in range(aliases)
        )

    path = tmp_path / "roles.yaml"
    path.write_text(roles(MAX_ALIASES))
    cfg = load_config(path)
    assert len(cfg.roles) == 101 and cfg.roles["r99"].ranks == [1]
    path.write_text(roles(MAX_ALIASES + 1))
    assert str(error_of(path)) == (
        f"{path}: invalid YAML at line 103, column 9: more than 100 aliases (the limit of a config)"
    )


def test_alias_bomb_stops_at_the_value_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert path.stat().st_size < 600  # expands to 9**9 = 387,420,489 strings
    assert str(error_of(path)) == f"{path}: {TOO_MANY}"
    assert str(error_of(alias_bomb())) == TOO_MANY


def test_shared_sub_objects_count_each_time_they_appear() -> None:
    tree: object = list(range(10))
    for _ in range(6):
        tree = [tree] * 10  # 10**7 values in 70 lists
    assert str(error_of({"zz": tree})) == TOO_MANY
    role = {"ranks": [0, 1]}
    cfg = load_config({"roles": {"actor": role, "ref": role}})
    assert cfg.roles["actor"] == cfg.roles["ref"] == RoleConfig(ranks=[0, 1])


def test_nesting_is_limited(tmp_path: Path) -> None:
    # The top mapping is level 1 and its values level 2: 98 lists put the 0 at level 100.
    assert error_of({"zz": nest(98)}).reason.startswith("unknown key")
    for depth in (99, 100_000):
        assert str(error_of({"zz": nest(depth)})) == TOO_DEEP
    assert str(error_of({"roles": {"actor": nest(100_000, mappings=True)}})) == TOO_DEEP
    itself: dict[str, object] = {}
    itself["zz"] = itself
    assert str(error_of(itself)) == TOO_DEEP

    assert error_of("zz: " + "[" * 98 + "0" + "]" * 98).reason.startswith("unknown key")
    for depth in (99, 100_000):
        err = error_of("zz: " + "[" * depth + "0" + "]" * depth)
        assert str(err) == f"invalid YAML at line 1, column 104: {TOO_DEEP}"
    assert str(error_of("zz: &a [*a]")) == TOO_DEEP  # a list holding itself

    path = tmp_path / "deep.json"
    for depth in (99, 100_000):
        path.write_text('{"zz": ' + "[" * depth + "0" + "]" * depth + "}")
        assert str(error_of(path)) == f"{path}: {TOO_DEEP}"


def test_long_integers_rejected_while_parsing(tmp_path: Path) -> None:
    digits = "9" * 5000
    reason = "an integer of 5000 digits (the limit of a config is 100)"
    err = error_of(f"rollout: {{delay: {digits}}}\n")
    assert str(err) == f"invalid YAML at line 1, column 18: {reason}"
    yaml_file, json_file = tmp_path / "long.yaml", tmp_path / "long.json"
    yaml_file.write_text(f"rollout:\n  delay: -{digits}\n")
    assert str(error_of(yaml_file)) == f"{yaml_file}: invalid YAML at line 2, column 10: {reason}"
    json_file.write_text(f'{{"rollout": {{"delay": -{digits}}}}}')
    assert str(error_of(json_file)) == f"{json_file}: invalid JSON: {reason}"
    # 100 digits are read, and the range names the key.
    json_file.write_text(f'{{"rollout": {{"delay": {"9" * 100}}}}}')
    assert str(error_of(json_file)) == (
        "rollout.delay: must be <= 9223372036854775807, got an integer of more than 40 digits"
    )


def test_json_duplicate_key_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"rollout": {"delay": 1, "forward_steps": 2, "delay": 2}}')
    assert str(error_of(path)) == f"{path}: invalid JSON: key 'delay' given twice in one object"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a: !!int abc", "not a valid int: 'abc'"),
        ("a: !!int ''", "not a valid int: ''"),
        ("a: !!float x", "not a valid float: 'x'"),
        ("a: !!bool x", "not a valid bool: 'x'"),
        ("a: !!timestamp x", "not a valid timestamp: 'x'"),
        ("a: 2001-02-30", "not a valid timestamp: '2001-02-30'"),
        ("a: !!set [1]", "expected a mapping node, but found sequence"),
    ],
)
def test_unreadable_yaml_scalars(text: str, reason: str) -> None:
    assert str(error_of("\n" + text)) == f"invalid YAML at line 2, column 4: {reason}"


def test_keys_that_would_break_the_line_are_quoted() -> None:
    assert str(error_of({"x\ny": 1})).startswith("['x\\ny']: unknown key")
    assert str(error_of({"rollout": {"a\u2028b": 1}})).startswith("rollout['a\\u2028b']: unknown")
    err = error_of({"global_profiler": {"steps": {"a\rb": 1}}})
    assert str(err) == "global_profiler.steps['a\\rb']: unknown key; expected 'every'"


# Arbitrary input, shaped like the real schema at every level.


def submodels(annotation: object) -> list[type[BaseModel]]:
    """The config sections an annotation holds: `X`, `X | None` or `dict[str, X]`."""
    return [
        arg
        for arg in (annotation, *get_args(annotation))
        if isinstance(arg, type) and issubclass(arg, BaseModel)
    ]


def schema_keys(model: type[BaseModel]) -> set[str]:
    """Every key name of `model` and of its sections, at any level."""
    keys = set(model.model_fields)
    for info in model.model_fields.values():
        for sub in submodels(info.annotation):
            keys |= schema_keys(sub)
    return keys


# Past 4300 digits Python refuses to print an int (hypothesis too): built, not listed.
huge_ints = st.builds(
    lambda digits, sign: sign * 10**digits, st.integers(4300, 6000), st.sampled_from([1, -1])
)
odd_leaves = st.one_of(
    huge_ints,
    st.sampled_from(
        [*SPECIAL_VALUES, 2**63, 2**63 - 1, -(2**63), 1e300, 1e-300, "a\0b", "~/x", "~no-user/y"]
    ),
)
any_keys = st.one_of(
    st.sampled_from(sorted(schema_keys(ProfilerConfig) | {"profile_continuous_steps", "every"})),
    st.text(max_size=8),
    st.integers(-2, 2),
)
any_trees = st.recursive(
    st.one_of(odd_leaves, st.none(), st.booleans(), st.integers(), st.floats(), st.text()),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(any_keys, children, max_size=4)
    ),
    max_leaves=20,
)
shallow = st.one_of(
    any_trees,
    st.builds(lambda tree, n: [tree] * n, any_trees, st.integers(0, 30)),  # shared
)
# Where a deeply nested value goes, if anywhere: (key, depth, mappings rather than lists).
deep_values = st.none() | st.tuples(
    st.sampled_from(["zz", "global_profiler.steps", "roles.actor", "tool_config.torch.schedule"]),
    st.integers(90, 3000),
    st.booleans(),
)


def shaped(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Mappings of `model`'s keys and random ones; a section's value is shaped in turn or not."""
    fields: dict[str, st.SearchStrategy[object]] = {}
    for name, info in model.model_fields.items():
        options = [shallow]
        for sub in submodels(info.annotation):
            section = shaped(sub)
            if get_origin(info.annotation) is dict:  # roles: {name: RoleConfig}
                section = st.dictionaries(st.sampled_from(["actor", "ref"]) | any_keys, section)
            options.append(section)
        fields[name] = st.one_of(*options)
    return st.builds(
        lambda known, extra: {**extra, **known},
        st.fixed_dictionaries({}, optional=fields),
        st.dictionaries(any_keys, shallow, max_size=2),
    )


def assert_one_line(err: ConfigError) -> None:
    assert str(err).splitlines() == [str(err)], repr(str(err))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shaped(ProfilerConfig), deep_values)
def test_any_input_gives_a_config_or_one_line_error(
    data: dict[Any, Any], deep: tuple[str, int, bool] | None
) -> None:
    if deep is not None:
        key, depth, mappings = deep
        data = {**data, **nested(key, nest(depth, mappings))}
    try:
        cfg = load_config(data)
    except ConfigError as err:
        assert_one_line(err)
    else:
        assert load_config(cfg.to_yaml()) == cfg


class HugeIntDumper(yaml.SafeDumper):
    """Writes an integer Python refuses to print (over 4300 digits) as 5000 nines."""


HugeIntDumper.add_representer(
    int,
    lambda dumper, n: dumper.represent_scalar(
        "tag:yaml.org,2002:int", str(n) if abs(n) < 10**4000 else "9" * 5000
    ),
)


def json_text(value: object) -> str:
    """`value` as JSON, integers Python refuses to print written as 5000 nines."""
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k))}: {json_text(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    if isinstance(value, int) and abs(value) >= 10**4000:
        return "9" * 5000
    return json.dumps(value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shaped(ProfilerConfig),
    st.none() | st.integers(90, 3000),
    st.sampled_from([".yaml", ".json"]),
)
def test_any_file_gives_a_config_or_one_line_error(
    tmp_path_factory: pytest.TempPathFactory,
    data: dict[Any, Any],
    depth: int | None,
    suffix: str,
) -> None:
    if suffix == ".json":
        text = json_text(data)
        if depth is not None:
            text = '{"zz": ' + "[" * depth + text + "]" * depth + "}"
    else:
        text = yaml.dump(data, Dumper=HugeIntDumper)
        if depth is not None:
            text += "zz: " + "[" * depth + "0" + "]" * depth + "\n"
    path = tmp_path_factory.getbasetemp() / f"fuzz{suffix}"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as err:
        assert_one_line(err)


# --- verl ----------------------------------------------------------------------------------

VERL: dict[str, Any] = {
    "data": {"train_batch_size": 256, "max_prompt_length": 512},
    "trainer": {"n_gpus_per_node": 8, "nnodes": 1, "total_training_steps": 10},
    "global_profiler": {
        "_target_": "verl.utils.profiler.ProfilerConfig",
        "tool": "torch",
        "steps": [1, 2, 5],
        "profile_continuous_steps": False,
        "save_path": "outputs/verl_profile",
        "relocate_results": False,
        "global_tool_config": {
            "nsys": {
                "discrete": False,
                "controller_nsight_options": {"trace": "cuda,nvtx,cublas,ucx"},
                "worker_nsight_options": {
                    "trace": "cuda,nvtx,cublas,ucx",
                    "capture-range": "cudaProfilerApi",
                },
            },
            "torch_memory": {
                "trace_alloc_max_entries": 50_000,
                "stack_depth": 16,
                "context": "all",
                "stacks": "all",
                "kw_args": {},
            },
        },
    },
    "actor_rollout_ref": {
        "hybrid_engine": True,
        "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
        "actor": {
            "strategy": "fsdp",
            "ppo_mini_batch_size": 64,
            "profiler": {
                "_target_": "verl.utils.profiler.ProfilerConfig",
                "tool": "torch",
                "enable": True,
                "all_ranks": False,
                "ranks": [0, 1],
                "save_path": "outputs/verl_profile",
                "tool_config": {
                    "torch": {"contents": ["cpu", "cuda", "shapes"], "discrete": True},
                    "npu": {"contents": [], "level": "level1", "analysis": True, "discrete": False},
                },
            },
        },
        "ref": {
            "profiler": {
                "enable": True,
                "all_ranks": False,
                "ranks": [],
                "tool_config": {"torch": {"discrete": False}},
            }
        },
        "rollout": {
            "name": "vllm",
            "mode": "async",
            "tensor_model_parallel_size": 2,
            "data_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "gpu_memory_utilization": 0.5,
            "profiler": {
                "tool": "torch",
                "enable": True,
                "all_ranks": False,
                "ranks": [0, 2, 3],
                "tool_config": {
                    "torch": {
                        "contents": [],
                        "discrete": True,
                        "profile_token_start": 12,
                        "profile_token_end": 46,
                    }
                },
            },
        },
    },
    "critic": {
        "strategy": "fsdp",
        "profiler": {
            "enable": False,
            "all_ranks": False,
            "ranks": [0],
            "tool_config": {"torch": {"discrete": True}},
        },
    },
}


def verl_with(path: str, value: object) -> dict[str, Any]:
    cfg = copy.deepcopy(VERL)
    *parents, last = path.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return cfg


_DELETE = object()


def test_one_door_maps_a_verl_config() -> None:
    assert not hasattr(aprof, "from_verl") and "from_verl" not in aprof.__all__
    assert not hasattr(aprof.verl, "from_verl")
    config, _, _ = map_verl(VERL)
    assert aprof.verl.load(VERL).config == config
    assert aprof.verl.load(VERL).config.global_profiler.save_path == Path("outputs/verl_profile")


def test_verl_load_maps_every_field() -> None:
    cfg = aprof.verl.load(VERL).config
    gp = cfg.global_profiler
    assert gp.tool == "torch"
    assert gp.steps == StepSelection.parse([1, 2, 5])
    assert gp.save_path == Path("outputs/verl_profile")
    assert gp.continuous is False
    assert cfg.roles["actor"] == RoleConfig(
        enable=True, all_ranks=False, ranks=[0, 1], discrete=True
    )
    assert cfg.roles["ref"] == RoleConfig(enable=True, all_ranks=False, ranks=[0], discrete=False)
    assert cfg.roles["critic"] == RoleConfig(enable=False, ranks=[0], discrete=True)
    assert not cfg.roles["critic"].selects(0)
    # Global ranks [0, 2, 3] with tp=2: rank 0 is replica 0, ranks 2 and 3 are replica 1.
    assert cfg.rollout == RolloutConfig(
        enable=True, replicas=[0, 1], start="on_step", delay=12, forward_steps=34
    )
    assert cfg.tool_config.torch.contents == ["cpu", "cuda", "shapes"]
    assert cfg.tool_config.npu.contents == ["npu", "cpu", "memory", "shapes", "module", "stack"]
    assert (cfg.tool_config.npu.level, cfg.tool_config.npu.analysis) == ("level1", True)
    assert cfg.tool_config.nsys.trace == ["cuda", "nvtx", "cublas", "ucx"]
    assert cfg.tool_config.torch_memory.max_entries == 50_000
    assert cfg.tool_config.torch_memory.stack_depth == 16
    assert cfg.timeouts == ProfilerConfig().timeouts
    assert load_config(cfg.to_yaml()) == cfg


def test_verl_load_rollout_inherits_actor() -> None:
    cfg = aprof.verl.load(verl_with("actor_rollout_ref.rollout.profiler", _DELETE)).config
    assert cfg.rollout.enable is True
    assert cfg.rollout.replicas == [0]  # actor ranks [0, 1] both live in replica 0 (tp=2)
    assert (cfg.rollout.delay, cfg.rollout.forward_steps) == (0, None)
    # A raw verl YAML keeps its interpolations; they mean "inherit" as well.
    raw = verl_with(
        "actor_rollout_ref.rollout.profiler.ranks",
        "${oc.select:actor_rollout_ref.actor.profiler.ranks,[]}",
    )
    assert aprof.verl.load(raw).config.rollout.replicas == [0]


def test_verl_load_rollout_all_ranks_and_sizes() -> None:
    cfg = aprof.verl.load(verl_with("actor_rollout_ref.rollout.profiler.all_ranks", True)).config
    assert cfg.rollout.replicas == "all"
    wide = verl_with("actor_rollout_ref.rollout.data_parallel_size", 2)  # W = 4
    assert aprof.verl.load(wide).config.rollout.replicas == [0]
    narrow = verl_with("actor_rollout_ref.rollout.tensor_model_parallel_size", None)  # W = 1
    assert aprof.verl.load(narrow).config.rollout.replicas == [0, 2, 3]


def test_verl_load_token_start_only() -> None:
    cfg = aprof.verl.load(
        verl_with("actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end", None)
    ).config
    assert (cfg.rollout.delay, cfg.rollout.forward_steps) == (12, None)


def test_verl_load_nsys_discrete_from_global_block() -> None:
    cfg = verl_with("global_profiler.tool", "nsys")
    cfg["global_profiler"]["global_tool_config"]["nsys"]["discrete"] = True
    mapped = aprof.verl.load(cfg).config
    assert mapped.global_profiler.tool == "nsys"
    assert all(role.discrete for role in mapped.roles.values())
    cfg["global_profiler"]["global_tool_config"]["nsys"]["discrete"] = "yes"
    with pytest.raises(ConfigError) as info:
        aprof.verl.load(cfg)
    assert info.value.key == "global_profiler.global_tool_config.nsys.discrete"


def test_verl_load_minimal() -> None:
    cfg = aprof.verl.load({"global_profiler": {"steps": None}}).config
    assert cfg.global_profiler.steps.is_empty
    assert cfg.roles == {}
    assert cfg.rollout.enable is False  # verl's profilers are off unless enabled
    assert aprof.verl.load({}).config == cfg


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("global_profiler.steps", "often"),
        ("global_profiler.tool", "precision_debugger"),
        ("global_profiler.profile_continuous_steps", "no"),
        ("global_profiler.save_path", 3.5),
        ("global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries", 0),
        ("actor_rollout_ref.actor.profiler.enable", "yes"),
        ("actor_rollout_ref.actor.profiler.ranks", "0"),
        ("actor_rollout_ref.actor.profiler.tool_config.torch.discrete", 1),
        ("actor_rollout_ref.actor.profiler.tool_config.torch.contents", ["gpu"]),
        ("actor_rollout_ref.actor.profiler.tool_config.npu.level", "max"),
        ("actor_rollout_ref.ref.profiler", [1]),
        ("critic.profiler.all_ranks", "all"),
        ("actor_rollout_ref.rollout.profiler.ranks", [0, "1"]),
        ("actor_rollout_ref.rollout.profiler.all_ranks", 1),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 0),
        ("actor_rollout_ref.rollout.data_parallel_size", "2"),
        ("actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start", -1),
        ("actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end", 12),
        ("actor_rollout_ref.rollout", "vllm"),
    ],
)
def test_verl_load_wrong_type_names_verl_key(path: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        aprof.verl.load(verl_with(path, value))
    assert info.value.key is not None
    assert info.value.key.startswith(path), str(info.value)


def test_verl_load_rejects_non_mapping() -> None:
    with pytest.raises(ConfigError):
        aprof.verl.load([1, 2])  # type: ignore[arg-type]


VERL_KEYS = [
    "profiler", "actor", "rollout", "ref", "enable", "ranks", "all_ranks", "tool_config", "torch",
    "npu", "contents", "discrete", "steps", "tool", "profile_token_start", "profile_token_end",
    "tensor_model_parallel_size", "global_tool_config", "nsys", "torch_memory", "stack_depth",
    "worker_nsight_options", "trace", "level", "analysis", "save_path",
]  # fmt: skip
verl_trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(VERL_KEYS), children, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(
    st.dictionaries(st.sampled_from(["global_profiler", "actor_rollout_ref", "critic"]), verl_trees)
)
def test_verl_load_fuzz(data: dict[str, Any]) -> None:
    with contextlib.suppress(ConfigError):
        aprof.verl.load(data)


# --- the documentation matches the code -----------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def documented_defaults() -> dict[str, object]:
    """`key` -> default, read from the first two cells of every key table row in the docs."""
    rows: dict[str, object] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[1].startswith("`"):
            # setdefault: the key tables come first; the verl table reuses the same layout.
            rows.setdefault(cells[0].strip("`"), yaml.safe_load(cells[1].split("`")[1]))
    return rows


def actual_defaults() -> dict[str, object]:
    def flatten(prefix: str, value: object, out: dict[str, object]) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                flatten(f"{prefix}.{k}" if prefix else k, v, out)
        else:
            out[prefix] = value

    out: dict[str, object] = {}
    flatten("", ProfilerConfig().model_dump(mode="json"), out)
    del out["roles"]
    flatten("roles.<name>", RoleConfig().model_dump(mode="json"), out)
    return out


def test_docs_list_every_key_with_its_default() -> None:
    documented = documented_defaults()
    for key, default in actual_defaults().items():
        assert key in documented, f"{key} is not documented"
        assert documented[key] == default, f"{key}: docs say {documented[key]!r}"
