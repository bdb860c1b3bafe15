"""make_tool: the tool a config builds, errors for tools that cannot run here, lazy imports."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

import aprof
from aprof.abc import CaptureTool
from aprof.tools import ToolUnavailableError, make_tool

MakeConfig = Callable[..., aprof.ProfilerConfig]


def test_importing_aprof_and_its_tools_package_does_not_import_torch() -> None:
    code = (
        "import sys, aprof, aprof.tools\n"
        "assert not {'torch', 'torch_npu'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_is_the_default_tool(make_config: MakeConfig) -> None:
    pytest.importorskip("torch")
    tool = make_tool(make_config())
    assert isinstance(tool, CaptureTool)
    assert tool.name == "torch"


def test_torch_tool_without_torch(make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch now fails
    with pytest.raises(ToolUnavailableError, match=r"^torch needs the torch package \(pip insta"):
        make_tool(make_config())


@pytest.mark.parametrize("tool", ["torch_memory", "nsys"])
def test_cuda_tools_without_cuda(tool: str, make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ToolUnavailableError) as caught:
        make_tool(make_config(global_profiler={"tool": tool}))
    assert str(caught.value) == (
        f"{tool} needs CUDA: torch.cuda.is_available() is False on this machine"
    )


def test_npu_tool_without_torch_npu(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ToolUnavailableError) as caught:
        make_tool(make_config(global_profiler={"tool": "npu"}))
    assert str(caught.value).startswith(
        "npu needs torch_npu (pip install torch_npu on an Ascend machine): "
    )
