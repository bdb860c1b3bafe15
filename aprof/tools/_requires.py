"""What a capture tool needs of its machine: torch and CUDA (else ``ToolUnavailableError``)."""

from __future__ import annotations

import importlib
from types import ModuleType

from aprof._errors import ToolUnavailableError


def require_torch(tool: str) -> ModuleType:
    """The torch module, or ToolUnavailableError naming ``tool``."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise ToolUnavailableError(
            f"{tool} needs the torch package (pip install 'aprof[torch]'): {exc}"
        ) from None


def require_cuda(tool: str) -> ModuleType:
    """The torch module when CUDA is usable, or ToolUnavailableError naming ``tool``."""
    torch = require_torch(tool)
    if not torch.cuda.is_available():
        raise ToolUnavailableError(
            f"{tool} needs CUDA: torch.cuda.is_available() is False on this machine"
        )
    return torch
