"""The ``npu`` capture tool: torch_npu.profiler on Ascend NPUs, raw ``*_ascend_pt`` output."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aprof.tools import ToolUnavailableError

if TYPE_CHECKING:
    from aprof._config import NPUToolConfig

_LEVELS = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}
"""aprof's ``level`` values -> names of ``torch_npu.profiler.ProfilerLevel`` attributes."""

_FLAGS = {
    "shapes": "record_shapes",
    "memory": "profile_memory",
    "stack": "with_stack",
    "module": "with_modules",
}
"""``contents`` extras -> ``torch_npu.profiler.profile`` keyword arguments."""


def _torch_npu() -> ModuleType:
    try:
        return importlib.import_module("torch_npu")
    except ImportError as exc:
        raise ToolUnavailableError(
            f"npu needs torch_npu (pip install torch_npu on an Ascend machine): {exc}"
        ) from None


class NPUTool:
    """torch_npu.profiler with ``level``, ``contents`` and ``analysis`` from the config.

    ``npu`` and ``cpu`` choose the activities; ``shapes``, ``memory``, ``stack``, ``module``
    turn on the matching profiler flags. Small by default: data simplification on, AI Core
    metrics only from level1 up, Db export, no parsing after the capture unless ``analysis``
    (parse later with ``analyse``). Stages are mstx ranges. Writes one
    ``<stem>_<pid>_<timestamp>_ascend_pt/`` folder per capture.
    """

    name = "npu"

    def __init__(self, config: NPUToolConfig) -> None:
        self._npu = _torch_npu()
        self.config = config
        self.note: str | None = None
        self._profiler: Any = None
        self._dir: Path | None = None
        self._before: set[Path] = set()
        self._stem = ""

    def start(self, dir: Path, stem: str) -> None:
        """Start a torch_npu.profiler capture whose ``*_ascend_pt`` folder goes into ``dir``."""
        if self._profiler is not None:
            raise RuntimeError("an npu capture is already active")
        prof = self._npu.profiler
        wanted = set(self.config.contents)
        activities = [
            activity
            for content, activity in (
                ("cpu", prof.ProfilerActivity.CPU),
                ("npu", prof.ProfilerActivity.NPU),
            )
            if content in wanted
        ]
        level = self.config.level
        # torch_npu resets aic_metrics to AiCoreNone (with a warning) below level1.
        low = level in ("level_none", "level0")
        experimental = prof._ExperimentalConfig(
            profiler_level=getattr(prof.ProfilerLevel, _LEVELS[level]),
            aic_metrics=prof.AiCMetrics.AiCoreNone if low else prof.AiCMetrics.PipeUtilization,
            mstx=True,  # collect the stage ranges
            data_simplification=True,
            export_type=prof.ExportType.Db,
        )
        dir.mkdir(parents=True, exist_ok=True)
        profiler = prof.profile(
            # Only extras in contents: None lets torch_npu record what it supports (CPU, NPU).
            activities=activities or None,
            on_trace_ready=prof.tensorboard_trace_handler(
                str(dir), worker_name=stem, analyse_flag=self.config.analysis
            ),
            experimental_config=experimental,
            **{flag: content in wanted for content, flag in _FLAGS.items()},
        )
        before = set(dir.glob(f"{stem}_*_ascend_pt"))
        profiler.start()
        self._profiler, self._dir, self._before, self._stem = profiler, dir, before, stem

    def stop(self) -> list[Path]:
        """Stop the capture (its trace handler writes the folder); the new ``*_ascend_pt``."""
        profiler, dir = self._profiler, self._dir
        if profiler is None or dir is None:
            raise RuntimeError("no npu capture is active")
        self._profiler = self._dir = None
        profiler.stop()
        found = sorted(set(dir.glob(f"{self._stem}_*_ascend_pt")) - self._before)
        # torch_npu prints and swallows its own errors, so a missing folder is the only sign.
        self.note = None if found else "torch_npu wrote no *_ascend_pt folder (see its output)"
        return found

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """An mstx range (``range_start``/``range_end``) named ``name``."""
        range_id = self._npu.npu.mstx.range_start(name)
        try:
            yield
        finally:
            self._npu.npu.mstx.range_end(range_id)

    def step(self) -> None:
        """No schedule is configured, so there is nothing to advance."""


def analyse(dir: Path, *, max_process_number: int | None = None) -> None:
    """Parse raw ``*_ascend_pt`` data under ``dir`` offline (``ASCEND_PROFILER_OUTPUT/``).

    Runs ``torch_npu.profiler.profiler.analyse``; raises ToolUnavailableError without torch_npu.
    """
    npu = _torch_npu()
    options = {} if max_process_number is None else {"max_process_number": max_process_number}
    npu.profiler.profiler.analyse(str(dir), **options)
