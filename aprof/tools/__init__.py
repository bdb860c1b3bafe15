"""Capture tools that run inside worker processes, one module per tool (each a
:class:`aprof.abc.CaptureTool`).

Nothing here imports torch or torch_npu: ``make_tool`` imports the chosen tool's module,
and that module imports its framework when the tool is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aprof._errors import ToolUnavailableError

if TYPE_CHECKING:
    from aprof._config import ProfilerConfig
    from aprof.abc import CaptureTool

__all__ = ["ToolUnavailableError", "make_tool"]


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
