"""The mini-batch schedule: its config, its verl mapping, and its phases against torch's."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprof
import aprof.verl
from aprof import ConfigError
from aprof._config import ScheduleConfig
from aprof.tools._schedule import MiniBatches

FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
VERL_SCHEDULE = "actor_rollout_ref.actor.profiler.tool_config.torch.schedule"

schedules = st.fixed_dictionaries(
    {
        "skip_first": st.integers(0, 5),
        "wait": st.integers(0, 5),
        "warmup": st.integers(0, 5),
        "active": st.integers(1, 5),
        "repeat": st.integers(0, 3),
    }
)


@given(tool=st.sampled_from(["torch", "npu"]), schedule=schedules)
def test_valid_schedules_load_and_print_back(tool: str, schedule: dict[str, int]) -> None:
    cfg = aprof.load_config({"tool_config": {tool: {"schedule": schedule}}})
    loaded = getattr(cfg.tool_config, tool).schedule
    assert {name: getattr(loaded, name) for name in FIELDS} == schedule
    assert loaded.stages == ["actor_update"]
    assert aprof.load_config(cfg.to_yaml()) == cfg


@given(
    tool=st.sampled_from(["torch", "npu"]),
    field=st.sampled_from(FIELDS),
    bad=st.one_of(
        st.integers(max_value=-1),
        st.booleans(),
        st.floats(allow_nan=False),
        st.text(max_size=3),
        st.none(),
    ),
)
def test_invalid_schedule_values_name_their_key(tool: str, field: str, bad: object) -> None:
    schedule: dict[str, object] = {"active": 1, field: bad}
    with pytest.raises(ConfigError) as caught:
        aprof.load_config({"tool_config": {tool: {"schedule": schedule}}})
    assert caught.value.key == f"tool_config.{tool}.schedule.{field}"


@pytest.mark.parametrize(
    ("schedule", "key", "reason"),
    [
        ({"active": 0}, "active", "must be > 0, got 0"),
        ({"wait": 2}, "active", "required: the mini-batches recorded per cycle (> 0)"),
        ({"active": 1, "stages": []}, "stages", "must list at least one item"),
        ({"active": 1, "stages": ["a", "a"]}, "stages[1]", "'a' is listed twice"),
    ],
)
def test_schedule_errors_say_what_is_wrong(schedule: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        aprof.load_config({"tool_config": {"torch": {"schedule": schedule}}})
    assert (caught.value.key, caught.value.reason) == (f"tool_config.torch.schedule.{key}", reason)


@pytest.mark.parametrize("tool", ["nsys", "torch_memory"])
def test_tools_without_a_schedule_reject_one_clearly(tool: str) -> None:
    with pytest.raises(ConfigError) as caught:
        aprof.load_config({"tool_config": {tool: {"schedule": {"active": 1}}}})
    assert str(caught.value) == (
        f"tool_config.{tool}.schedule: this tool has no mini-batch schedule; only "
        "tool_config.torch.schedule and tool_config.npu.schedule exist"
    )


def test_schedule_is_off_by_default_and_null_turns_it_off() -> None:
    cfg = aprof.load_config({"tool_config": {"torch": {"schedule": None}}})
    assert cfg.tool_config.torch.schedule is None
    assert aprof.load_config({}).tool_config.npu.schedule is None


def test_nsys_finalize_s_default_and_bound() -> None:
    assert aprof.load_config({}).tool_config.nsys.finalize_s == 60
    with pytest.raises(ConfigError, match=r"^tool_config.nsys.finalize_s: must be > 0, got 0$"):
        aprof.load_config({"tool_config": {"nsys": {"finalize_s": 0}}})


@settings(deadline=None)  # the first example imports torch
@given(schedule=schedules, mini_batch=st.integers(0, 80))
def test_phases_follow_torch_profiler_schedule(schedule: dict[str, int], mini_batch: int) -> None:
    torch = pytest.importorskip("torch")
    action = torch.profiler.ProfilerAction
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when warmup is 0
        native = torch.profiler.schedule(**schedule)
    counted = MiniBatches(ScheduleConfig(**schedule))
    counted.current = mini_batch
    phase = counted.phase(mini_batch)
    expected = native(mini_batch)
    if phase == "active":
        assert expected in (action.RECORD, action.RECORD_AND_SAVE)
        first, last = counted.cycle()
        assert last == mini_batch
        assert all(native(k) == action.RECORD for k in range(first, last))
        # The cycle starts after a mini-batch that is not recording, or that saved a cycle.
        assert first == 0 or native(first - 1) != action.RECORD
        assert last - first < schedule["active"]
    elif phase == "warmup":
        assert expected == action.WARMUP
    else:
        assert expected == action.NONE


def verl(schedule: object, tool: str = "torch") -> dict[str, Any]:
    return {
        "global_profiler": {"tool": tool, "steps": [1]},
        "actor_rollout_ref": {
            "actor": {
                "profiler": {"enable": True, "tool_config": {"torch": {"schedule": schedule}}}
            }
        },
    }


def test_verl_load_maps_the_torch_schedule() -> None:
    schedule = {"skip_first": 2, "wait": 1, "warmup": 1, "active": 3, "repeat": 2}
    mapped = aprof.verl.load(verl(schedule)).config.tool_config.torch.schedule
    assert mapped == ScheduleConfig(**schedule, stages=["actor_update"])


@pytest.mark.parametrize(
    ("schedule", "tool"),
    [
        ({"wait": 1, "warmup": 1, "active": 0, "repeat": 0}, "torch"),  # verl's "off"
        ({"wait": 1}, "torch"),
        (None, "torch"),
        ({"active": 2}, "npu"),  # verl schedules torch only
    ],
)
def test_verl_load_schedule_off(schedule: object, tool: str) -> None:
    cfg = aprof.verl.load(verl(schedule, tool)).config
    assert (cfg.tool_config.torch.schedule, cfg.tool_config.npu.schedule) == (None, None)


@pytest.mark.parametrize(
    ("schedule", "key", "reason"),
    [
        ({"active": 2, "wait": -1}, f"{VERL_SCHEDULE}.wait", "must be >= 0, got -1"),
        ({"active": "2"}, f"{VERL_SCHEDULE}.active", "expected an integer, got '2'"),
        (3, VERL_SCHEDULE, "expected a mapping, got 3"),
    ],
)
def test_verl_load_schedule_errors_name_the_verl_key(
    schedule: object, key: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        aprof.verl.load(verl(schedule))
    assert (caught.value.key, caught.value.reason) == (key, reason)
