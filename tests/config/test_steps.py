"""Step selection: the forms `global_profiler.steps` accepts, its errors, runs and rendering."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprof._config import StepSelection
from aprof._config.steps import MAX_SELECTED
from aprof._errors import ConfigError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ([], ()),
        (3, (3,)),
        ([5, 1, 2], (1, 2, 5)),
        ((2, 4), (2, 4)),
        ("1-3,5", (1, 2, 3, 5)),
        (" 1 - 3 , 5 ", (1, 2, 3, 5)),
        ("7", (7,)),
        ("4-4", (4,)),
        ("10,2-3", (2, 3, 10)),
    ],
)
def test_explicit_forms(value: object, expected: tuple[int, ...]) -> None:
    sel = StepSelection.parse(value)
    assert sel.explicit == expected
    assert sel.every is None
    assert sel.is_empty == (expected == ())
    assert all(n in sel for n in expected)
    assert 0 not in sel


def test_every() -> None:
    sel = StepSelection.parse({"every": 3})
    assert sel.every == 3
    assert sel.explicit is None
    assert [n for n in range(1, 11) if n in sel] == [3, 6, 9]
    assert 0 not in sel and -3 not in sel
    assert not sel.is_empty
    assert sel.to_config() == {"every": 3}
    assert str(sel) == "every 3"
    assert StepSelection.parse({"every": 1}).last_of_run(5) is False


def test_nothing_selected() -> None:
    sel = StepSelection.parse(None)
    assert sel == StepSelection() == StepSelection.parse([])
    assert sel.is_empty
    assert 1 not in sel
    assert sel.to_config() is None
    assert str(sel) == "none"


def test_membership_ignores_non_ints() -> None:
    sel = StepSelection.parse([1, 2])
    assert "1" not in sel
    assert 1.0 not in sel
    assert True not in sel  # a bool is not a step


def test_last_of_run() -> None:
    sel = StepSelection.parse([1, 2, 5, 7, 8, 9])
    assert [n for n in range(1, 11) if sel.last_of_run(n)] == [2, 5, 9]
    assert not sel.last_of_run(3)  # not selected at all
    every2 = StepSelection.parse({"every": 2})
    assert every2.last_of_run(4) and not every2.last_of_run(5)


def test_canonical_forms() -> None:
    sel = StepSelection.parse("5,1-3")
    assert sel.to_config() == [1, 2, 3, 5]
    assert str(sel) == "1-3,5"
    assert repr(sel) == "StepSelection('1-3,5')"
    assert StepSelection.parse(sel.to_config()) == sel
    assert StepSelection.parse(sel) is sel


def test_value_object() -> None:
    a, b = StepSelection.parse("1-3"), StepSelection.parse([3, 2, 1])
    assert a == b and hash(a) == hash(b)
    assert len({a, b, StepSelection.parse({"every": 1})}) == 2
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.every = 2  # type: ignore[misc]


def test_direct_construction_checks_invariants() -> None:
    with pytest.raises(ValueError, match="ascending"):
        StepSelection(explicit=(2, 1))
    with pytest.raises(ValueError, match="exactly one"):
        StepSelection(explicit=None, every=None)


@pytest.mark.parametrize(
    ("value", "key", "reason"),
    [
        (0, "global_profiler.steps", "positive integer"),
        (-2, "global_profiler.steps", "positive integer"),
        (True, "global_profiler.steps", "got true"),
        (2.0, "global_profiler.steps", "got 2.0"),
        ("a", "global_profiler.steps", "'a' is not a step"),
        ("-1", "global_profiler.steps", "'-1' is not a step"),
        ([1, 2, 0], "global_profiler.steps[2]", "positive integer"),
        ([1, -1], "global_profiler.steps[1]", "positive integer"),
        ([1, False], "global_profiler.steps[1]", "got false"),
        ([1, 2.0], "global_profiler.steps[1]", "got 2.0"),
        ([1, "2"], "global_profiler.steps[1]", "got '2'"),
        ([1, 2, 1], "global_profiler.steps[2]", "step 1 is listed twice"),
        ("1-3,2", "global_profiler.steps", "step 2 is selected twice"),
        ("1,1", "global_profiler.steps", "step 1 is selected twice"),
        ("3-1", "global_profiler.steps", "reversed range '3-1'"),
        ("1,,2", "global_profiler.steps", "item 2 of '1,,2' is empty"),
        ("1,2,", "global_profiler.steps", "item 3 of '1,2,' is empty"),
        ("", "global_profiler.steps", "is empty"),
        ("0-2", "global_profiler.steps", "1-based"),
        ("1-", "global_profiler.steps", "not a step or a range"),
        ({"every": 0}, "global_profiler.steps.every", "positive integer"),
        ({"every": 1.5}, "global_profiler.steps.every", "got 1.5"),
        ({"every": True}, "global_profiler.steps.every", "got true"),
        ({"every": 2, "start": 1}, "global_profiler.steps.start", "unknown key"),
        ({}, "global_profiler.steps", "empty mapping"),
        ({1, 2}, "global_profiler.steps", "got a set"),
        (f"1-{MAX_SELECTED + 1}", "global_profiler.steps", "more than"),
    ],
)
def test_errors_name_key_and_reason(value: object, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        StepSelection.parse(value)
    assert info.value.key == key
    assert reason in info.value.reason
    assert str(info.value) == f"{key}: {info.value.reason}"


def test_error_key_is_configurable() -> None:
    with pytest.raises(ConfigError, match=r"^steps\[1\]: "):
        StepSelection.parse([1, 0], key="steps")


@given(st.sets(st.integers(min_value=1, max_value=500), max_size=60))
def test_range_string_round_trip(steps: set[int]) -> None:
    sel = StepSelection.parse(sorted(steps))
    assert sel.explicit == tuple(sorted(steps))
    rendered = str(sel)
    again = StepSelection.parse(None if rendered == "none" else rendered)
    assert again == sel
    assert set(again.explicit or ()) == steps


@given(st.sets(st.integers(min_value=1, max_value=60), max_size=40))
def test_last_of_run_matches_definition(steps: set[int]) -> None:
    sel = StepSelection.parse(sorted(steps))
    for n in range(0, 62):
        assert sel.last_of_run(n) == (n in steps and n + 1 not in steps)
