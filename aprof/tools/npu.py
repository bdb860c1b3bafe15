"""The ``npu`` capture tool: torch_npu.profiler on Ascend NPUs, raw ``*_ascend_pt`` output."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aprof._errors import ToolError, ToolUnavailableError
from aprof.tools._schedule import MiniBatches, cycle_stem

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
    ``<stem>_<pid>_<timestamp>_ascend_pt/`` folder per capture; a scheduled capture writes one
    per recorded cycle, renamed ``<stem>-mb<first>-<last>_<pid>_<timestamp>_ascend_pt/``.
    """

    name = "npu"

    def __init__(self, config: NPUToolConfig) -> None:
        self._npu = _torch_npu()
        self.config = config
        self.note: str | None = None
        self._profiler: Any = None
        self._dir = Path()
        self._stem = ""
        self._handler: Callable[[Any], None] | None = None
        self._mini_batches: MiniBatches | None = None
        self._seen: set[Path] = set()
        self._found: list[Path] = []
        self._failures: list[str] = []

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Start a torch_npu.profiler capture whose ``*_ascend_pt`` folders go into ``dir``.

        ``scheduled``: follow ``tool_config.npu.schedule`` (``torch_npu.profiler.schedule``),
        advanced by ``step``.
        """
        if self._profiler is not None:
            raise ToolError("an npu capture is already active")
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
        schedule = self.config.schedule if scheduled else None
        mini_batches = MiniBatches(schedule) if schedule is not None else None
        dir.mkdir(parents=True, exist_ok=True)
        # The handler names the folder (torch_npu creates it when a cycle begins).
        handler = prof.tensorboard_trace_handler(
            str(dir), worker_name=stem, analyse_flag=self.config.analysis
        )
        profiler = prof.profile(
            # Only extras in contents: None lets torch_npu record what it supports (CPU, NPU).
            activities=activities or None,
            # Keywords: torch_npu's positional order (wait, active, warmup, ...) is not torch's.
            schedule=prof.schedule(**mini_batches.native()) if mini_batches else None,
            on_trace_ready=self._trace_ready,
            experimental_config=experimental,
            **{flag: content in wanted for content, flag in _FLAGS.items()},
        )
        self._dir, self._stem, self._handler = dir, stem, handler
        self._mini_batches, self._found, self._failures = mini_batches, [], []
        self._seen = set(self._folders())
        profiler.start()
        self._profiler = profiler

    def stop(self) -> list[Path]:
        """Stop the capture (a cycle it cuts short is flushed); the new ``*_ascend_pt``."""
        profiler = self._profiler
        if profiler is None:
            raise ToolError("no npu capture is active")
        self._profiler = None
        profiler.stop()
        mini_batches = self._mini_batches
        notes = list(self._failures)
        if mini_batches is None:
            # torch_npu prints and swallows its own errors, so a missing folder is the only sign.
            if not self._found:
                notes.append("torch_npu wrote no *_ascend_pt folder (see its output)")
        else:
            end = mini_batches.end_note(len(self._found) + len(self._failures))
            notes += [end] if end else []
        self.note = "; ".join(notes) or None
        return list(self._found)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """An mstx range (``range_start``/``range_end``) named ``name``."""
        range_id = self._npu.npu.mstx.range_start(name)
        try:
            yield
        finally:
            self._npu.npu.mstx.range_end(range_id)

    def step(self) -> None:
        """The current mini-batch ended: advance the schedule (nothing without one)."""
        if self._profiler is None or self._mini_batches is None:
            return
        self._profiler.step()  # flushes the cycle that ended with this mini-batch, if one did
        self._mini_batches.current += 1

    def _folders(self) -> list[Path]:
        return sorted(self._dir.glob(f"{self._stem}_*_ascend_pt"))

    def _trace_ready(self, profiler: Any) -> None:
        # torch_npu calls this when a recorded cycle (or the whole unscheduled capture) ends,
        # after it finalised the cycle's folder; the handler parses it when `analysis` is on.
        if self._handler is not None:
            self._handler(profiler)
        new = [f for f in self._folders() if f not in self._seen]
        if self._mini_batches is None:
            self._found += new
            return
        first, last = self._mini_batches.cycle()
        for folder in new:
            # The folder holds this cycle only: name it for its mini-batches, as torch's files.
            tail = folder.name.removeprefix(self._stem)
            renamed = folder.with_name(cycle_stem(self._stem, first, last) + tail)
            try:
                folder.rename(renamed)
            except OSError as exc:
                self._seen.add(folder)
                self._failures.append(f"mini-batches {first}-{last} left in {folder.name}: {exc}")
                self._found.append(folder)
                continue
            self._found.append(renamed)


def analyse(dir: Path, *, max_process_number: int | None = None) -> None:
    """Parse raw ``*_ascend_pt`` data under ``dir`` offline (``ASCEND_PROFILER_OUTPUT/``).

    Runs ``torch_npu.profiler.profiler.analyse``; raises ToolUnavailableError without torch_npu.
    """
    npu = _torch_npu()
    options = {} if max_process_number is None else {"max_process_number": max_process_number}
    npu.profiler.profiler.analyse(str(dir), **options)
