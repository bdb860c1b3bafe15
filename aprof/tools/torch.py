"""The ``torch`` capture tool: torch.profiler, Chrome traces (gzip by default)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from aprof.tools import _require_torch

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
    ``<stem>.pt.trace.json.gz`` (``.json`` with ``gzip: false``).
    """

    name = "torch"

    def __init__(self, config: TorchToolConfig) -> None:
        _require_torch(self.name)
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
        self._config_note = "; ".join(notes) or None
        self._profiler: torch.profiler.profile | None = None
        self._path: Path | None = None

    def start(self, dir: Path, stem: str) -> None:
        """Start a torch.profiler capture whose trace goes to ``dir``."""
        import torch.profiler

        global _active
        if self._profiler is not None:
            raise RuntimeError("a torch capture is already active")
        if _active is not None:
            # Two torch.profiler captures in one process end each other and then crash it.
            raise RuntimeError("another torch capture is active in this process")
        wanted = set(self.config.contents)
        profiler = torch.profiler.profile(
            activities=self._activities,
            record_shapes="shapes" in wanted,
            with_stack="stack" in wanted,
            profile_memory="memory" in wanted,
        )
        suffix = ".pt.trace.json.gz" if self.config.gzip else ".pt.trace.json"
        dir.mkdir(parents=True, exist_ok=True)
        profiler.start()
        self._profiler, self._path = profiler, dir / f"{stem}{suffix}"
        _active = self
        self.note = self._config_note

    def stop(self) -> list[Path]:
        """Stop the capture and export its trace (torch gzips a ``.gz`` path itself)."""
        profiler, path = self._profiler, self._path
        if profiler is None or path is None:
            raise RuntimeError("no torch capture is active")
        global _active
        # Cleared first: torch.profiler crashes the process on a second stop().
        self._profiler = self._path = None
        _active = None
        profiler.stop()
        profiler.export_chrome_trace(str(path))
        return [path]

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A ``record_function`` range (``user_annotation`` in the trace)."""
        import torch.profiler

        with torch.profiler.record_function(name):
            yield

    def step(self) -> None:
        """No schedule is configured, so there is nothing to advance."""
