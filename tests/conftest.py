"""Shared fixtures: a profiler config in a temporary save_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., aprof.ProfilerConfig]:
    """Build a config whose save_path is the test's tmp_path; keyword sections override."""

    def build(**sections: Any) -> aprof.ProfilerConfig:
        data: dict[str, Any] = {
            "global_profiler": {"steps": [1], "save_path": str(tmp_path / "profile")},
            "timeouts": {"start_s": 2, "stop_s": 2, "poll_s": 0.005, "connect_s": 1},
        }
        for key, value in sections.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return aprof.load_config(data)

    return build
