"""The ``torch`` capture tool: torch.profiler, Chrome traces (gzip by default)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aprof._errors import ToolError
from aprof._safe_files import vacant
from aprof.tools._requires import require_torch
from aprof.tools._schedule import MiniBatches, cycle_stem

if TYPE_CHECKING:
    import torch.profiler

    from aprof._config import TorchToolConfig


_active: TorchTool | None = None
"""The capture of this process, if one is running (torch.profiler allows one at a time)."""


class TorchTool:
    """torch.profiler with the activities and extras of ``tool_config.torch.contents``.

    ``cpu`` and ``cuda`` choose the activities (``cuda`` only where CUDA is available; with
    no activity left, CPU is recorded), ``shapes``, ``stack`` and ``memory`` turn on
    ``record_shapes``, ``with_stack`` and ``profile_memory``. Writes
    ``<stem>.pt.trace.json.gz`` (``.json`` with ``gzip: false``); a scheduled capture writes
    one ``<stem>-mb<first>-<last>.pt.trace.json.gz`` per recorded cycle instead.
    """

    name = "torch"

    def __init__(self, config: TorchToolConfig) -> None:
        require_torch(self.name)
        import torch

        self.config = config
        self.note: str | None = None
        wanted = set(config.contents)
        activities = []
        notes = []
        if "cpu" in wanted:
            activities.append(torch.profiler.ProfilerActivity.CPU)
        if "cuda" in wanted:
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            else:
                notes.append("cuda not recorded: torch.cuda.is_available() is False")
        if not activities:
            # `contents: [cuda]` on a machine without CUDA: a CPU trace beats an empty one.
            activities.append(torch.profiler.ProfilerActivity.CPU)
            notes.append("no activity left in contents: recorded cpu")
        self._activities = activities
        self._config_notes = notes
        self._suffix = ".pt.trace.json.gz" if config.gzip else ".pt.trace.json"
        self._profiler: torch.profiler.profile | None = None
        self._dir = Path()
        self._stem = ""
        self._mini_batches: MiniBatches | None = None
        self._files: list[Path] = []
        self._failures: list[str] = []

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Start a torch.profiler capture whose traces go to ``dir``.

        ``scheduled``: follow ``tool_config.torch.schedule`` (``torch.profiler.schedule``),
        advanced by ``step``; each recorded cycle is exported as soon as it ends.
        """
        import torch.profiler

        global _active
        if self._profiler is not None:
            raise ToolError("a torch capture is already active")
        if _active is not None:
            # Two torch.profiler captures in one process end each other and then crash it.
            raise ToolError("another torch capture is active in this process")
        wanted = set(self.config.contents)
        schedule = self.config.schedule if scheduled else None
        mini_batches = MiniBatches(schedule) if schedule is not None else None
        options: dict[str, Any] = {}
        if mini_batches is not None:
            # torch prepares in warmup and hands each finished cycle to the callback.
            options = {
                "schedule": torch.profiler.schedule(**mini_batches.native()),
                "on_trace_ready": self._cycle_ready,
            }
        profiler = torch.profiler.profile(
            activities=self._activities,
            record_shapes="shapes" in wanted,
            with_stack="stack" in wanted,
            profile_memory="memory" in wanted,
            **options,
        )
        dir.mkdir(parents=True, exist_ok=True)
        self._dir, self._stem, self._mini_batches = dir, stem, mini_batches
        self._files, self._failures = [], []
        profiler.start()
        self._profiler = profiler
        _active = self
        self.note = "; ".join(self._config_notes) or None

    def stop(self) -> list[Path]:
        """Stop the capture and export what it recorded (torch gzips a ``.gz`` path itself)."""
        profiler = self._profiler
        if profiler is None:
            raise ToolError("no torch capture is active")
        global _active
        # Cleared first: torch.profiler crashes the process on a second stop().
        self._profiler = None
        _active = None
        profiler.stop()  # a scheduled capture flushes a cycle it cuts short through the callback
        mini_batches = self._mini_batches
        if mini_batches is None:
            path = self._dir / f"{self._stem}{self._suffix}"
            profiler.export_chrome_trace(vacant(path))
            return [path]
        end = mini_batches.end_note(len(self._files) + len(self._failures))
        notes = [*self._config_notes, *self._failures, *([end] if end else [])]
        self.note = "; ".join(notes) or None
        return list(self._files)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A ``record_function`` range (``user_annotation`` in the trace)."""
        import torch.profiler

        with torch.profiler.record_function(name):
            yield

    def step(self) -> None:
        """The current mini-batch ended: advance the schedule (nothing without one)."""
        profiler, mini_batches = self._profiler, self._mini_batches
        if profiler is None or mini_batches is None:
            return
        profiler.step()  # exports the cycle that ended with this mini-batch, if one did
        mini_batches.current += 1

    def _cycle_ready(self, profiler: torch.profiler.profile) -> None:
        # Called by torch inside step() (a cycle completed) or stop() (a cycle cut short).
        assert self._mini_batches is not None
        first, last = self._mini_batches.cycle()
        path = self._dir / f"{cycle_stem(self._stem, first, last)}{self._suffix}"
        try:
            profiler.export_chrome_trace(vacant(path))
        except Exception as exc:  # one lost cycle must not end the capture
            self._failures.append(f"mini-batches {first}-{last} not written: {exc}")
            return
        self._files.append(path)
