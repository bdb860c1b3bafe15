"""The ``torch_memory`` capture tool: CUDA caching-allocator history and snapshots."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from aprof._errors import ToolError
from aprof._safe_files import vacant
from aprof.tools._requires import require_cuda

if TYPE_CHECKING:
    from aprof._config import TorchMemoryToolConfig


class TorchMemoryTool:
    """Records allocator history for one capture and dumps it as ``<stem>.pickle``.

    ``max_entries`` bounds the history ring; ``context`` and ``stacks`` go to torch as they are
    (``stacks="python"`` gives smaller snapshots than ``"all"``, which adds C++ frames); torch
    has no depth limit, so ``stack_depth`` is not applied and the note says so. With
    ``snapshot_on_oom`` each CUDA out-of-memory error during a capture dumps
    ``<stem>.oom-<n>.pickle`` before the error propagates.
    """

    name = "torch_memory"

    def __init__(self, config: TorchMemoryToolConfig) -> None:
        torch = require_cuda(self.name)
        self.config = config
        self.note: str | None = None
        self._dir: Path | None = None
        self._stem = ""
        self._oom_files: list[Path] = []
        if config.snapshot_on_oom:
            # torch offers no way to detach an observer: attach once, act only while capturing.
            torch._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Start recording allocator history (the ring keeps the last ``max_entries`` events).

        torch_memory has no schedule (the config cannot give one): ``scheduled`` is never true.
        """
        import torch.cuda.memory

        if self._dir is not None:
            raise ToolError("a torch_memory capture is already active")
        dir.mkdir(parents=True, exist_ok=True)
        cfg = self.config
        torch.cuda.memory._record_memory_history(
            context=cfg.context, stacks=cfg.stacks, max_entries=cfg.max_entries
        )
        self._dir, self._stem, self._oom_files = dir, stem, []
        self.note = "stack_depth is not applied: torch records whole stacks"

    def stop(self) -> list[Path]:
        """Dump the snapshot, stop recording; the snapshot (and any OOM snapshot)."""
        import torch.cuda.memory

        dir, stem = self._dir, self._stem
        if dir is None:
            raise ToolError("no torch_memory capture is active")
        self._dir = None
        path = dir / f"{stem}.pickle"
        try:
            torch.cuda.memory._dump_snapshot(vacant(path))  # type: ignore[no-untyped-call]
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return [*self._oom_files, path]

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A ``record_function`` range around the stage."""
        import torch.profiler

        with torch.profiler.record_function(name):
            yield

    def step(self) -> None:
        """No schedule: nothing to advance."""

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        # Called by the allocator before the OutOfMemoryError is raised; the history is intact.
        import torch.cuda.memory

        if self._dir is None:
            return
        path = self._dir / f"{self._stem}.oom-{len(self._oom_files) + 1}.pickle"
        torch.cuda.memory._dump_snapshot(vacant(path))  # type: ignore[no-untyped-call]
        self._oom_files.append(path)
