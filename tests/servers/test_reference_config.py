"""ReferenceConfig and Faults: frozen, validated with clear errors; no torch on import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from servers.reference import Faults, ReferenceConfig


def test_defaults_and_absolute_profiler_dir() -> None:
    cfg = ReferenceConfig(profiler_dir=Path("traces"))
    assert cfg.dialect == "vllm"
    assert cfg.vllm_version_tuple == (0, 32, 0)
    assert cfg.profiler_dir == Path.cwd() / "traces"
    assert ReferenceConfig(vllm_version="0.9", profiling=False).vllm_version_tuple == (0, 9, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "profiler_dir is required"),
        ({"vllm_version": "0.32.0rc1", "profiling": False}, "must look like X.Y or X.Y.Z"),
        ({"dialect": "trt"}, "dialect"),
        ({"dialect": "sglang", "launch_max_iterations": 2}, "vLLM launch options"),
        ({"profiling": False, "launch_delay_iterations": 1}, "need profiling"),
        (
            {"vllm_version": "0.11.0", "profiler_dir": "/t", "launch_max_iterations": 1},
            "no launch-time iteration window",
        ),
        ({"profiling": False, "launch_max_iterations": -1}, "greater than or equal to 0"),
        ({"profiling": False, "api_key": " "}, "must not be empty"),
        ({"profiling": False, "model_name": ""}, "must not be empty"),
        ({"profiling": False, "faults": {"fail_routes": ["health"]}}, "starts with '/'"),
        ({"profiling": False, "faults": {"stop_delay_s": -1}}, "greater than or equal to 0"),
        ({"profiling": False, "surprise": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_config_is_refused_clearly(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ReferenceConfig(**fields)


def test_configs_are_frozen() -> None:
    cfg = ReferenceConfig(dialect="sglang")
    with pytest.raises(ValidationError):
        cfg.dialect = "vllm"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Faults().hang_stop = True  # type: ignore[misc]


def test_sglang_needs_no_profiler_dir() -> None:
    assert ReferenceConfig(dialect="sglang").profiler_dir is None


def test_importing_the_server_does_not_import_torch() -> None:
    code = "import sys, servers.reference; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
