"""aprof: an asyncio-native profiling runtime for LLM agent loops and asynchronous RL training.

The front door: every public name is defined in a private module named for what it holds.
"""

from aprof import verl  # the verl entry point: aprof.verl.load
from aprof._blocking import BlockingProfiler
from aprof._capture import (
    CaptureFile,
    CaptureResult,
    CaptureTarget,
    CountSource,
    ManagedTarget,
    TargetKind,
    Window,
    WorkerCapture,
)
from aprof._config import (
    LimitsConfig,
    ProfilerConfig,
    TimeoutsConfig,
    load_config,
    read_config_file,
)
from aprof._errors import CaptureError, ConfigError, describe
from aprof._logging import configure_logging
from aprof._manifest import Manifest, ManifestError, RankCapture, WindowRecord, load_manifest
from aprof._merge import MergedStep, merge
from aprof._report import report
from aprof._report_model import RunReport
from aprof._scheduler import Profiler
from aprof._sharing import RolloutProfiler
from aprof._steps import StepSelection
from aprof._timeline.recorder import Request, timeline_backend
from aprof._verl import from_verl
from aprof._worker import WorkerProfiler, staged
from aprof._worker_group import LocalWorker, WorkerGroup, WorkerHandle

__version__ = "0.1.0"

__all__ = [
    "BlockingProfiler",
    "CaptureError",
    "CaptureFile",
    "CaptureResult",
    "CaptureTarget",
    "ConfigError",
    "CountSource",
    "LimitsConfig",
    "LocalWorker",
    "ManagedTarget",
    "Manifest",
    "ManifestError",
    "MergedStep",
    "Profiler",
    "ProfilerConfig",
    "RankCapture",
    "Request",
    "RolloutProfiler",
    "RunReport",
    "StepSelection",
    "TargetKind",
    "TimeoutsConfig",
    "Window",
    "WindowRecord",
    "WorkerCapture",
    "WorkerGroup",
    "WorkerHandle",
    "WorkerProfiler",
    "__version__",
    "configure_logging",
    "describe",
    "from_verl",
    "load_config",
    "load_manifest",
    "merge",
    "read_config_file",
    "report",
    "staged",
    "timeline_backend",
    "verl",
]
