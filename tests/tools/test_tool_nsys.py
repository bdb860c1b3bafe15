"""The nsys tool against a double of torch's CUDA profiler and NVTX calls; its command builders.

This machine has no CUDA and no nsys, so ``torch.cuda.cudart()``, ``torch.cuda.synchronize``
and ``torch.cuda.nvtx.range_push``/``range_pop`` are replaced by a double with the real names
and signatures that records each call and, like nsys with ``--capture-range-end=repeat``,
writes a report when a capture range ends.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

import aprof
from aprof.tools import make_tool
from aprof.tools.nsys import nsys_command, ray_nsight_runtime_env, report_dir

torch = pytest.importorskip("torch")

MakeConfig = Callable[..., aprof.ProfilerConfig]


class CudaProfilerDouble:
    """Mirrors ``cudart()``'s profiler calls and NVTX; ``calls`` lists them in order."""

    def __init__(self, reports: Path) -> None:
        self.reports = reports
        self.calls: list[str] = []
        self.status = 0  # cudaError.success
        self.write_report = True
        self._ranges = 0

    def cudart(self) -> CudaProfilerDouble:
        return self

    def cudaProfilerStart(self) -> int:
        self.calls.append("cudaProfilerStart")
        return self.status

    def cudaProfilerStop(self) -> int:
        self.calls.append("cudaProfilerStop")
        if self.write_report and self.status == 0:
            self._ranges += 1
            self.reports.mkdir(parents=True, exist_ok=True)
            (self.reports / f"worker_4242.{self._ranges}.nsys-rep").write_bytes(b"report")
        return self.status

    def synchronize(self, device: object = None) -> None:
        self.calls.append("synchronize")

    def range_push(self, msg: str) -> None:
        self.calls.append(f"range_push {msg}")

    def range_pop(self) -> None:
        self.calls.append("range_pop")


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    return tmp_path / "nsys-reports"


@pytest.fixture
def double(monkeypatch: pytest.MonkeyPatch, reports: Path) -> CudaProfilerDouble:
    """Install the double over torch.cuda (and report CUDA as available)."""
    fake = CudaProfilerDouble(reports)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", fake.cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", fake.range_push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", fake.range_pop)
    return fake


def test_double_mirrors_the_real_signatures() -> None:
    """The double's NVTX and synchronize parameters are those of the installed torch."""
    fake = CudaProfilerDouble(Path())
    for ours, theirs in [
        (fake.range_push, torch.cuda.nvtx.range_push),
        (fake.range_pop, torch.cuda.nvtx.range_pop),
        (fake.synchronize, torch.cuda.synchronize),
        (fake.cudart, torch.cuda.cudart),
    ]:
        assert list(inspect.signature(ours).parameters) == list(
            inspect.signature(theirs).parameters
        )


def test_double_capture_range_with_nvtx_stages_lists_new_reports(
    double: CudaProfilerDouble, reports: Path, make_config: MakeConfig, tmp_path: Path
) -> None:
    reports.mkdir()
    (reports / "older.nsys-rep").write_bytes(b"from an earlier run")
    cfg = make_config(
        global_profiler={"tool": "nsys"}, tool_config={"nsys": {"output_dir": str(reports)}}
    )
    tool = make_tool(cfg)
    tool.start(tmp_path / "step_1", "actor_step1")
    with tool.stage("update_actor"), tool.stage("update_actor/forward"):
        pass
    assert tool.stop() == [reports / "worker_4242.1.nsys-rep"]
    assert tool.note is None
    assert double.calls == [
        "cudaProfilerStart",
        "range_push update_actor",
        "range_push update_actor/forward",
        "range_pop",
        "range_pop",
        "synchronize",
        "cudaProfilerStop",
    ]

    tool.start(tmp_path / "step_2", "actor_step2")
    assert tool.stop() == [reports / "worker_4242.2.nsys-rep"]


def test_double_stage_range_is_popped_when_the_stage_raises(
    double: CudaProfilerDouble, make_config: MakeConfig
) -> None:
    tool = make_tool(make_config(global_profiler={"tool": "nsys"}))
    with pytest.raises(ValueError, match="boom"), tool.stage("update_actor"):
        raise ValueError("boom")
    assert double.calls == ["range_push update_actor", "range_pop"]


def test_double_report_not_written_yet_is_noted(
    double: CudaProfilerDouble, make_config: MakeConfig, tmp_path: Path
) -> None:
    double.write_report = False
    cfg = make_config(global_profiler={"tool": "nsys"})
    tool = make_tool(cfg)
    tool.start(tmp_path, "s")
    assert tool.stop() == []
    assert tool.note == (
        f"no new report in {report_dir(cfg)} yet: nsys writes it at range end or exit"
    )


def test_double_cuda_error_fails_the_call(
    double: CudaProfilerDouble, make_config: MakeConfig, tmp_path: Path
) -> None:
    double.status = 5
    tool = make_tool(make_config(global_profiler={"tool": "nsys"}))
    with pytest.raises(RuntimeError, match="cudaProfilerStart failed with CUDA error 5"):
        tool.start(tmp_path, "s")
    with pytest.raises(RuntimeError, match="no nsys capture is active"):
        tool.stop()


def test_report_dir_is_the_users_choice_else_under_save_path(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    assert report_dir(make_config()) == tmp_path / "profile" / "nsys"
    chosen = make_config(tool_config={"nsys": {"output_dir": "/data/reports"}})
    assert report_dir(chosen) == Path("/data/reports")


def test_nsys_command_exact_argv(make_config: MakeConfig) -> None:
    cfg = make_config(tool_config={"nsys": {"trace": ["cuda", "nvtx", "osrt"]}}).tool_config.nsys
    argv = ["python", "train.py", "--steps", "3"]
    assert nsys_command(cfg, argv, output="/data/reports/worker_%p") == [
        "nsys",
        "profile",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat",
        "--trace=cuda,nvtx,osrt",
        "-o",
        "/data/reports/worker_%p",
        "python",
        "train.py",
        "--steps",
        "3",
    ]
    stop = nsys_command(cfg, ["x"], output=Path("r"), capture_range_end="stop")
    assert stop[3] == "--capture-range-end=stop"
    assert stop[6] == "r"


def test_ray_nsight_runtime_env_exact_options(make_config: MakeConfig) -> None:
    cfg = make_config().tool_config.nsys
    assert ray_nsight_runtime_env(cfg, "/data/reports/worker_%p") == {
        "capture-range": "cudaProfilerApi",
        "capture-range-end": "repeat",
        "t": "cuda,nvtx",
        "o": "/data/reports/worker_%p",
    }
    relative = ray_nsight_runtime_env(cfg, "reports/w_%p", capture_range_end="repeat-shutdown:6")
    # Ray joins `o` onto its own log folder: only an absolute path keeps the user's choice.
    assert relative["o"] == str(Path.cwd() / "reports" / "w_%p")
    assert relative["capture-range-end"] == "repeat-shutdown:6"
