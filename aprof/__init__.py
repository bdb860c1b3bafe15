"""aprof: an asyncio-native profiling runtime for LLM agent loops and asynchronous RL training.

The front door: every public name is defined in a private module named for what it holds
and re-exported here, reporting ``aprof`` as its module. What a training process does not
need loads when it is first used: the merge and the report (``aprof.merge``,
``aprof.report``), and the subpackages ``aprof.ray`` (Ray) and ``aprof.verl`` (verl's hooks).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from aprof._accounting import StepAccount
from aprof._capture import (
    CaptureFile,
    CaptureResult,
    CountSource,
    TargetKind,
    Window,
    WorkerCapture,
    WorkerTimeline,
)
from aprof._config import (
    LimitsConfig,
    ProfilerConfig,
    StepSelection,
    TimeoutsConfig,
    load_config,
    read_config_file,
)
from aprof._control import CaptureAnswer
from aprof._core import BlockingProfiler, Profiler
from aprof._errors import (
    AprofError,
    CaptureError,
    ConfigError,
    ExportError,
    FileTooLargeError,
    ManifestError,
    NotRegularFileError,
    StepError,
    TargetError,
    ToolError,
    ToolUnavailableError,
    UnsafeNameError,
    UnsafePathError,
    UsageError,
    WindowStateError,
    WorkerGroupError,
    describe,
)
from aprof._logging import configure_logging
from aprof._manifest import Manifest, RankCapture, WindowRecord, load_manifest
from aprof._timeline.recorder import Request, timeline_backend
from aprof._workers import LocalWorker, WorkerGroup, WorkerProfiler, staged
from aprof.abc import CaptureTarget, CaptureTool, ManagedTarget, RolloutProfiler, WorkerHandle

if TYPE_CHECKING:
    from aprof import ray, verl
    from aprof._merge import MergedStep, hta_trace_files, merge
    from aprof._report import RunReport, report

__version__ = "0.1.0"

_LAZY = {
    "MergedStep": "aprof._merge",
    "merge": "aprof._merge",
    "hta_trace_files": "aprof._merge",
    "RunReport": "aprof._report",
    "report": "aprof._report",
}
"""Names whose module loads when the name is first used: reading a run back needs them, a
training process does not."""
_SUBPACKAGES = ("ray", "verl")
"""Loaded when first used: ``aprof.ray`` needs Ray for most of what it does, ``aprof.verl``
verl."""

__all__ = [
    "AprofError",
    "BlockingProfiler",
    "CaptureAnswer",
    "CaptureError",
    "CaptureFile",
    "CaptureResult",
    "CaptureTarget",
    "CaptureTool",
    "ConfigError",
    "CountSource",
    "ExportError",
    "FileTooLargeError",
    "LimitsConfig",
    "LocalWorker",
    "ManagedTarget",
    "Manifest",
    "ManifestError",
    "MergedStep",
    "NotRegularFileError",
    "Profiler",
    "ProfilerConfig",
    "RankCapture",
    "Request",
    "RolloutProfiler",
    "RunReport",
    "StepAccount",
    "StepError",
    "StepSelection",
    "TargetError",
    "TargetKind",
    "TimeoutsConfig",
    "ToolError",
    "ToolUnavailableError",
    "UnsafeNameError",
    "UnsafePathError",
    "UsageError",
    "Window",
    "WindowRecord",
    "WindowStateError",
    "WorkerCapture",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerHandle",
    "WorkerProfiler",
    "WorkerTimeline",
    "__version__",
    "configure_logging",
    "describe",
    "hta_trace_files",
    "load_config",
    "load_manifest",
    "merge",
    "ray",
    "read_config_file",
    "report",
    "staged",
    "timeline_backend",
    "verl",
]


def _as_ours(obj: Any) -> None:
    """Have a re-exported class or function say it is ``aprof``'s (its repr, its docs)."""
    if isinstance(obj, type) or callable(obj):
        with contextlib.suppress(AttributeError, TypeError):  # a compiled type names itself
            obj.__module__ = __name__


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    _as_ours(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


for _name in __all__:
    if _name not in _LAZY and _name not in _SUBPACKAGES and not _name.startswith("__"):
        _as_ours(globals()[_name])
del _name
