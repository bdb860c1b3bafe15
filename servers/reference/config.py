"""What one reference server is launched with: dialect, version era, profiling, faults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?$")


def version_tuple(version: str) -> tuple[int, int, int]:
    """``"0.32"`` -> ``(0, 32, 0)``; raises ValueError on anything but ``X.Y[.Z]``."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"vllm_version must look like X.Y or X.Y.Z, got {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


class Faults(BaseModel):
    """Misbehaviour injected for reliability tests; the defaults inject nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_delay_s: float = Field(default=0.0, ge=0)
    """Seconds ``/start_profile`` waits before acting (a slow start)."""
    stop_delay_s: float = Field(default=0.0, ge=0)
    """Seconds ``/stop_profile`` waits before acting (a slow stop)."""
    hang_stop: bool = False
    """``/stop_profile`` never answers and leaves the capture running."""
    fail_routes: frozenset[str] = frozenset()
    """Paths that answer 500 without doing anything."""
    crash_on: frozenset[str] = frozenset()
    """Paths on which the whole process exits at once with status 1 (subprocess use only)."""

    @field_validator("fail_routes", "crash_on")
    @classmethod
    def _paths(cls, paths: frozenset[str]) -> frozenset[str]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"a route path starts with '/', got {path!r}")
        return paths


class ReferenceConfig(BaseModel):
    """How a reference server behaves: which real server it imitates, and how it was launched."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dialect: Literal["vllm", "sglang"] = "vllm"
    """Which real server's routes and profiling behaviour to imitate."""
    vllm_version: str = "0.32.0"
    """vLLM release imitated (``X.Y[.Z]``); decides the era behaviour. vLLM dialect only."""
    profiling: bool = True
    """vLLM: profiling enabled at launch; without it the profile routes answer 404."""
    profiler_dir: Path | None = None
    """vLLM: the trace directory fixed at launch (required with profiling).
    SGLang: the default ``output_dir`` (``SGLANG_TORCH_PROFILER_DIR``); None = system temp dir."""
    launch_delay_iterations: int = Field(default=0, ge=0)
    """vLLM >= 0.12: launch-time ``delay_iterations`` (0 = none)."""
    launch_max_iterations: int = Field(default=0, ge=0)
    """vLLM >= 0.12: launch-time ``max_iterations`` (0 = unlimited)."""
    api_key: str | None = None
    """Bearer key the real server would require (on the routes that server protects)."""
    model_name: str = "reference"
    """The served model name; completions naming another model are refused."""
    seed: int = 0
    """Seeds the model weights."""
    faults: Faults = Faults()

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, version: str) -> str:
        version_tuple(version)
        return version

    @field_validator("api_key", "model_name")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("profiler_dir")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # vLLM makes its trace directory absolute at launch; so does this server.
        return None if path is None else path.expanduser().absolute()

    @model_validator(mode="after")
    def _consistent(self) -> ReferenceConfig:
        launch_window = self.launch_delay_iterations or self.launch_max_iterations
        if self.dialect == "sglang":
            if launch_window:
                raise ValueError(
                    "launch_delay_iterations/launch_max_iterations are vLLM launch options; "
                    "SGLang bounds a capture per call (num_steps)"
                )
            return self
        if self.profiling and self.profiler_dir is None:
            raise ValueError("profiler_dir is required when profiling is enabled (dialect vllm)")
        if launch_window and not self.profiling:
            raise ValueError("launch_delay_iterations/launch_max_iterations need profiling")
        if launch_window and self.vllm_version_tuple < (0, 12, 0):
            raise ValueError(
                f"vLLM {self.vllm_version} has no launch-time iteration window (since 0.12)"
            )
        return self

    @property
    def vllm_version_tuple(self) -> tuple[int, int, int]:
        """``vllm_version`` as a comparable tuple."""
        return version_tuple(self.vllm_version)
