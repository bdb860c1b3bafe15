"""The torch_memory tool against a double of torch's CUDA memory-history API.

This machine has no CUDA, so ``torch.cuda.memory._record_memory_history``, ``_dump_snapshot``
and ``torch._C._cuda_attach_out_of_memory_observer`` are replaced by a double with the real
functions' names and signatures (checked against the installed torch) that records each call.
"""

from __future__ import annotations

import inspect
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.tools import make_tool

torch = pytest.importorskip("torch")

MakeConfig = Callable[..., aprof.ProfilerConfig]
Observer = Callable[[int, int, int, int], None]


class CudaMemoryDouble:
    """Mirrors the CUDA memory-history functions; ``calls`` lists what the tool did, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.observers: list[Observer] = []
        self.recording = False

    def _record_memory_history(
        self,
        enabled: str | None = "all",
        context: str | None = "all",
        stacks: str = "all",
        max_entries: int = sys.maxsize,
        device: Any = None,
        clear_history: bool = False,
        compile_context: bool = False,
        global_record_annotations: bool = False,
        skip_actions: list[str] | None = None,
    ) -> None:
        shown = {"enabled": enabled, "context": context, "stacks": stacks}
        self.calls.append(("_record_memory_history", {**shown, "max_entries": max_entries}))
        self.recording = enabled is not None

    def _dump_snapshot(
        self, filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False
    ) -> None:
        self.calls.append(("_dump_snapshot", {"filename": filename}))
        # A real snapshot taken while recording holds the trace of every allocator event.
        snapshot: dict[str, list[Any]] = {
            "segments": [],
            "device_traces": [[]] if self.recording else [],
        }
        Path(filename).write_bytes(pickle.dumps(snapshot))

    def _cuda_attach_out_of_memory_observer(self, observer: Observer) -> None:
        self.calls.append(("_cuda_attach_out_of_memory_observer", {}))
        self.observers.append(observer)


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch) -> CudaMemoryDouble:
    """Install the double over torch.cuda (and report CUDA as available)."""
    fake = CudaMemoryDouble()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake._record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", fake._dump_snapshot)
    monkeypatch.setattr(
        torch._C,
        "_cuda_attach_out_of_memory_observer",
        fake._cuda_attach_out_of_memory_observer,
        raising=False,  # absent from CPU builds of torch
    )
    return fake


def test_double_mirrors_the_real_signatures() -> None:
    """The double's parameters are those of the installed torch's functions."""
    fake = CudaMemoryDouble()
    real = torch.cuda.memory
    pairs = [
        (fake._record_memory_history, real._record_memory_history_impl),
        (fake._dump_snapshot, real._dump_snapshot),
    ]
    for ours, theirs in pairs:
        assert list(inspect.signature(ours).parameters) == list(
            inspect.signature(theirs).parameters
        )


def test_double_capture_records_history_and_dumps_a_snapshot(
    double: CudaMemoryDouble, make_config: MakeConfig, tmp_path: Path
) -> None:
    cfg = make_config(
        global_profiler={"tool": "torch_memory"},
        tool_config={"torch_memory": {"max_entries": 5000, "stack_depth": 16}},
    )
    tool = make_tool(cfg)
    tool.start(tmp_path / "step_1", "actor_step1")
    with tool.stage("update_actor"):
        pass
    files = tool.stop()

    snapshot = tmp_path / "step_1" / "actor_step1.pickle"
    assert files == [snapshot]
    assert pickle.loads(snapshot.read_bytes())["device_traces"] == [[]]
    assert double.calls == [
        (
            "_record_memory_history",
            {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000},
        ),
        ("_dump_snapshot", {"filename": str(snapshot)}),
        (
            "_record_memory_history",
            {"enabled": None, "context": "all", "stacks": "all", "max_entries": sys.maxsize},
        ),
    ]
    assert tool.note == "stack_depth is not applied: torch records whole stacks"


@pytest.mark.parametrize(
    ("context", "stacks"), [("state", "python"), ("alloc", "all"), (None, "python")]
)
def test_double_context_and_stacks_reach_record_memory_history(
    double: CudaMemoryDouble,
    make_config: MakeConfig,
    tmp_path: Path,
    context: str | None,
    stacks: str,
) -> None:
    cfg = make_config(
        global_profiler={"tool": "torch_memory"},
        tool_config={"torch_memory": {"context": context, "stacks": stacks}},
    )
    tool = make_tool(cfg)
    tool.start(tmp_path, "s")
    tool.stop()
    assert double.calls[0] == (
        "_record_memory_history",
        {"enabled": "all", "context": context, "stacks": stacks, "max_entries": 100_000},
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("context", "frames", "state"),
        ("stacks", "cpp", "python"),
        ("stacks", None, "python"),
    ],
)
def test_context_and_stacks_are_checked(
    make_config: MakeConfig, key: str, value: object, reason: str
) -> None:
    with pytest.raises(aprof.ConfigError, match=reason) as err:
        make_config(tool_config={"torch_memory": {key: value}})
    assert err.value.key == f"tool_config.torch_memory.{key}"


def test_double_oom_snapshot_only_when_asked_and_only_during_a_capture(
    double: CudaMemoryDouble, make_config: MakeConfig, tmp_path: Path
) -> None:
    make_tool(make_config(global_profiler={"tool": "torch_memory"}))
    assert double.observers == []  # snapshot_on_oom is off by default

    cfg = make_config(
        global_profiler={"tool": "torch_memory"},
        tool_config={"torch_memory": {"snapshot_on_oom": True}},
    )
    tool = make_tool(cfg)
    [observer] = double.observers
    observer(0, 1 << 30, 1 << 33, 0)  # no capture active: ignored
    assert list(tmp_path.iterdir()) == []

    tool.start(tmp_path, "actor_step2")
    observer(0, 1 << 30, 1 << 33, 0)
    observer(0, 1 << 31, 1 << 33, 0)
    files = tool.stop()
    assert [p.name for p in files] == [
        "actor_step2.oom-1.pickle",
        "actor_step2.oom-2.pickle",
        "actor_step2.pickle",
    ]
    assert all(p.is_file() for p in files)
    assert [name for name, _ in double.calls].count("_cuda_attach_out_of_memory_observer") == 1


def test_double_history_is_disabled_even_when_the_dump_fails(
    double: CudaMemoryDouble,
    make_config: MakeConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def failing_dump(filename: str = "", augment_with_fx_traces: bool = False) -> None:
        raise OSError("disk full")

    tool = make_tool(make_config(global_profiler={"tool": "torch_memory"}))
    tool.start(tmp_path, "s")
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", failing_dump)
    with pytest.raises(OSError, match="disk full"):
        tool.stop()
    assert not double.recording
    with pytest.raises(RuntimeError, match="no torch_memory capture is active"):
        tool.stop()
