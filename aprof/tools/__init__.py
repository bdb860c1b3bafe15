"""Capture tools that run inside worker processes, one module per tool.

Nothing here imports torch or torch_npu: ``make_tool`` imports the chosen tool's module,
and that module imports its framework when the tool is built.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from aprof.tools._requires import ToolUnavailableError

if TYPE_CHECKING:
    from aprof._config import ProfilerConfig

__all__ = ["CaptureTool", "ToolUnavailableError", "make_tool"]


@runtime_checkable
class CaptureTool(Protocol):
    """One capture at a time inside a worker process (synchronous)."""

    name: str
    """The tool's name as in ``global_profiler.tool``."""
    note: str | None
    """Anything the manifest reader should know about the last capture (``None`` if nothing)."""

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Begin a capture writing into ``dir``; every file name starts with ``stem``.

        ``scheduled``: follow the tool's mini-batch schedule, advanced by ``step`` (only
        passed, as True, to a tool whose config has one).
        """
        ...

    def stop(self) -> list[Path]:
        """End the capture; the files and folders it wrote."""
        ...

    def stage(self, name: str) -> AbstractContextManager[None]:
        """A named range (stage) inside the active capture."""
        ...

    def step(self) -> None:
        """The current mini-batch ended: advance a scheduled capture; else nothing."""
        ...


def make_tool(config: ProfilerConfig) -> CaptureTool:
    """The capture tool ``config.global_profiler.tool`` selects, built with its options.

    Raises ToolUnavailableError when the tool cannot run here (no torch, no CUDA, no torch_npu).
    """
    tool = config.global_profiler.tool
    options = config.tool_config
    if tool == "torch":
        from aprof.tools.torch import TorchTool

        return TorchTool(options.torch)
    if tool == "torch_memory":
        from aprof.tools.torch_memory import TorchMemoryTool

        return TorchMemoryTool(options.torch_memory)
    if tool == "nsys":
        from aprof.tools.nsys import NsysTool, report_dir

        return NsysTool(options.nsys, report_dir(config))
    from aprof.tools.npu import NPUTool

    return NPUTool(options.npu)
