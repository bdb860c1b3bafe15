"""Hypothesis' profiles (tests/conftest.py): a plain ``python -m pytest`` draws the same
examples every run; ``--hypothesis-profile=explore`` draws new ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def drawn() -> list[object]:
    """The examples one property test draws, with a per-test setting as the suite's have."""
    seen: list[object] = []

    @settings(max_examples=25)
    @given(st.lists(st.integers() | st.text(max_size=5), max_size=4))
    def probe(value: list[object]) -> None:
        seen.append(value)

    probe()
    return seen


def test_a_plain_run_draws_the_same_examples_every_time(pytestconfig: pytest.Config) -> None:
    deterministic = settings.get_profile("deterministic")
    assert deterministic.derandomize and deterministic.database is None
    assert deterministic.deadline is None and deterministic.print_blob
    explore = settings.get_profile("explore")
    assert not explore.derandomize and explore.database is not None and explore.print_blob
    if pytestconfig.getoption("--hypothesis-profile") is not None:
        pytest.skip("another hypothesis profile was chosen")
    assert settings.get_current_profile_name() == "deterministic"
    first = drawn()
    assert 0 < len(first) <= 25  # the per-test max_examples holds
    assert drawn() == first
