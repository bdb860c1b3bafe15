"""The npu tool against a double of torch_npu (no Ascend NPU or CANN here).

The double is installed as ``sys.modules["torch_npu"]``. Its names, signatures, constants and
behaviour follow the torch_npu 2.13/2.14 wheel as the workers reference note records it:
``profiler.profile`` (keyword-only), ``_ExperimentalConfig``, ``tensorboard_trace_handler``
(which writes ``<worker_name>_<pid>_<timestamp>_ascend_pt/`` when the profiler stops),
``profiler.profiler.analyse`` and ``npu.mstx.range_start``/``range_end``.
"""

from __future__ import annotations

import enum
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.cli import main
from aprof.tools import make_tool
from aprof.tools.npu import analyse

MakeConfig = Callable[..., aprof.ProfilerConfig]
Calls = list[tuple[str, dict[str, Any]]]
FOLDER = re.compile(r"(?P<stem>.+)_(?P<pid>\d+)_\d{17}_ascend_pt")


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1


def build_torch_npu(calls: Calls) -> dict[str, types.ModuleType]:
    """The double's modules by import name; every call is appended to ``calls``."""

    class ProfilerLevel:
        Level0 = "Level0"
        Level1 = "Level1"
        Level2 = "Level2"
        Level_none = "Level_none"

    class AiCMetrics:
        PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
        ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
        Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
        AiCoreNone = "ACL_AICORE_NONE"

    class ExportType:
        Db = "db"
        Text = "text"

    class _ExperimentalConfig:
        def __init__(
            self,
            profiler_level: str = ProfilerLevel.Level0,
            aic_metrics: str = AiCMetrics.PipeUtilization,
            l2_cache: bool = False,
            msprof_tx: bool = False,
            mstx: bool = False,
            data_simplification: bool = True,
            record_op_args: bool = False,
            op_attr: bool = False,
            gc_detect_threshold: float | None = None,
            export_type: str | list[str] = ExportType.Text,
            host_sys: list[str] | None = None,
            mstx_domain_include: list[str] | None = None,
            mstx_domain_exclude: list[str] | None = None,
            sys_io: bool = False,
            sys_interconnection: bool = False,
        ) -> None:
            given = dict(locals())
            del given["self"]
            calls.append(("_ExperimentalConfig", given))

    def tensorboard_trace_handler(
        dir_name: str | None = None,
        worker_name: str | None = None,
        analyse_flag: bool = True,
        async_mode: bool = False,
    ) -> Callable[[Any], None]:
        calls.append(
            (
                "tensorboard_trace_handler",
                {"dir_name": dir_name, "worker_name": worker_name, "analyse_flag": analyse_flag},
            )
        )

        def handler(prof: Any) -> None:
            calls.append(("trace_ready", {}))
            stamp = datetime.now().strftime("%Y%m%d%H%M%S%f")[:-3]
            folder = Path(str(dir_name)) / f"{worker_name}_{os.getpid()}_{stamp}_ascend_pt"
            (folder / "FRAMEWORK").mkdir(parents=True)
            (folder / "PROF_000001_20260101000000000_ABC").mkdir()
            (folder / "profiler_metadata.json").write_text("{}")
            if analyse_flag:
                (folder / "ASCEND_PROFILER_OUTPUT").mkdir()

        return handler

    class profile:
        def __init__(
            self,
            *,
            activities: list[ProfilerActivity] | None = None,
            schedule: Any = None,
            on_trace_ready: Callable[[Any], None] | None = None,
            record_shapes: bool = False,
            profile_memory: bool = False,
            with_stack: bool = False,
            with_flops: bool = False,
            with_modules: bool = False,
            experimental_config: Any = None,
            execution_trace_observer: Any = None,
            custom_trace_id_callback: Callable[[], str] | None = None,
            use_cuda: bool | None = None,
        ) -> None:
            given = dict(locals())
            del given["self"]
            calls.append(("profile", given))
            self.on_trace_ready = on_trace_ready

        def start(self) -> None:
            calls.append(("start", {}))

        def stop(self) -> None:
            calls.append(("stop", {}))
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

        def step(self) -> None:
            calls.append(("step", {}))

    def analyse(
        profiler_path: str,
        max_process_number: int = (os.cpu_count() or 2) // 2,
        export_type: str | list[str] | None = None,
    ) -> None:
        calls.append(
            (
                "analyse",
                {"profiler_path": profiler_path, "max_process_number": max_process_number},
            )
        )

    ids = iter(range(1, 1000))

    def range_start(message: str, stream: Any = None, domain: str = "default") -> int:
        range_id = next(ids)
        calls.append(("range_start", {"message": message, "id": range_id}))
        return range_id

    def range_end(range_id: int, domain: str = "default") -> None:
        calls.append(("range_end", {"range_id": range_id}))

    inner = types.ModuleType("torch_npu.profiler.profiler")
    inner.analyse = analyse  # type: ignore[attr-defined]
    prof = types.ModuleType("torch_npu.profiler")
    for name, value in {
        "profile": profile,
        "ProfilerActivity": ProfilerActivity,
        "tensorboard_trace_handler": tensorboard_trace_handler,
        "_ExperimentalConfig": _ExperimentalConfig,
        "ProfilerLevel": ProfilerLevel,
        "AiCMetrics": AiCMetrics,
        "ExportType": ExportType,
        "profiler": inner,
    }.items():
        setattr(prof, name, value)
    mstx = types.ModuleType("torch_npu.npu.mstx")
    mstx.range_start = range_start  # type: ignore[attr-defined]
    mstx.range_end = range_end  # type: ignore[attr-defined]
    npu = types.ModuleType("torch_npu.npu")
    npu.mstx = mstx  # type: ignore[attr-defined]
    root = types.ModuleType("torch_npu")
    root.profiler = prof  # type: ignore[attr-defined]
    root.npu = npu  # type: ignore[attr-defined]
    return {
        "torch_npu": root,
        "torch_npu.profiler": prof,
        "torch_npu.profiler.profiler": inner,
        "torch_npu.npu": npu,
        "torch_npu.npu.mstx": mstx,
    }


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Install the torch_npu double; the list its calls are recorded in."""
    recorded: Calls = []
    for name, module in build_torch_npu(recorded).items():
        monkeypatch.setitem(sys.modules, name, module)
    return recorded


def npu_config(make_config: MakeConfig, **npu: Any) -> aprof.ProfilerConfig:
    return make_config(global_profiler={"tool": "npu"}, tool_config={"npu": npu})


def run_capture(cfg: aprof.ProfilerConfig, dir: Path, stem: str = "actor_step1") -> list[Path]:
    tool = make_tool(cfg)
    tool.start(dir, stem)
    with tool.stage("update_actor"):
        tool.step()
    return tool.stop()


def call(calls: Calls, name: str) -> dict[str, Any]:
    [found] = [kwargs for called, kwargs in calls if called == name]
    return found


def test_double_defaults_keep_data_small_and_write_one_raw_folder(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    files = run_capture(npu_config(make_config), tmp_path / "step_1")

    [folder] = files
    match = FOLDER.fullmatch(folder.name)
    assert folder.parent == tmp_path / "step_1"
    assert match is not None
    assert (match["stem"], match["pid"]) == ("actor_step1", str(os.getpid()))
    assert sorted(p.name for p in folder.iterdir()) == [
        "FRAMEWORK",
        "PROF_000001_20260101000000000_ABC",
        "profiler_metadata.json",
    ]  # raw: no ASCEND_PROFILER_OUTPUT without analysis

    assert [name for name, _ in calls] == [
        "_ExperimentalConfig",
        "tensorboard_trace_handler",
        "profile",
        "start",
        "range_start",
        "range_end",
        "stop",
        "trace_ready",
    ]
    experimental = call(calls, "_ExperimentalConfig")
    assert experimental["profiler_level"] == "Level0"
    assert experimental["aic_metrics"] == "ACL_AICORE_NONE"
    assert experimental["data_simplification"] is True
    assert experimental["mstx"] is True
    assert experimental["export_type"] == "db"
    assert call(calls, "tensorboard_trace_handler") == {
        "dir_name": str(tmp_path / "step_1"),
        "worker_name": "actor_step1",
        "analyse_flag": False,
    }
    profile = call(calls, "profile")
    assert profile["activities"] == [ProfilerActivity.CPU, ProfilerActivity.NPU]
    assert profile["schedule"] is None
    flags = ("record_shapes", "profile_memory", "with_stack", "with_modules", "with_flops")
    assert {flag: profile[flag] for flag in flags} == dict.fromkeys(flags, False)
    assert call(calls, "range_start")["message"] == "update_actor"
    assert call(calls, "range_end")["range_id"] == call(calls, "range_start")["id"]


@pytest.mark.parametrize(
    ("level", "profiler_level", "aic_metrics"),
    [
        ("level_none", "Level_none", "ACL_AICORE_NONE"),
        ("level0", "Level0", "ACL_AICORE_NONE"),
        ("level1", "Level1", "ACL_AICORE_PIPE_UTILIZATION"),
        ("level2", "Level2", "ACL_AICORE_PIPE_UTILIZATION"),
    ],
)
def test_double_level_maps_to_profiler_level_and_ai_core_metrics(
    calls: Calls,
    make_config: MakeConfig,
    tmp_path: Path,
    level: str,
    profiler_level: str,
    aic_metrics: str,
) -> None:
    run_capture(npu_config(make_config, level=level), tmp_path)
    experimental = call(calls, "_ExperimentalConfig")
    assert (experimental["profiler_level"], experimental["aic_metrics"]) == (
        profiler_level,
        aic_metrics,
    )


@pytest.mark.parametrize(
    ("contents", "activities", "on"),
    [
        (["npu"], [ProfilerActivity.NPU], set()),
        (["cpu"], [ProfilerActivity.CPU], set()),
        (["npu", "shapes"], [ProfilerActivity.NPU], {"record_shapes"}),
        (["memory"], None, {"profile_memory"}),  # None: torch_npu's supported activities
        (
            ["stack", "module", "memory", "shapes", "cpu", "npu"],
            [ProfilerActivity.CPU, ProfilerActivity.NPU],
            {"record_shapes", "profile_memory", "with_stack", "with_modules"},
        ),
    ],
)
def test_double_contents_map_to_activities_and_flags(
    calls: Calls,
    make_config: MakeConfig,
    tmp_path: Path,
    contents: list[str],
    activities: list[ProfilerActivity] | None,
    on: set[str],
) -> None:
    run_capture(npu_config(make_config, contents=contents), tmp_path)
    profile = call(calls, "profile")
    assert profile["activities"] == activities
    flags = ("record_shapes", "profile_memory", "with_stack", "with_modules", "with_flops")
    assert {flag for flag in flags if profile[flag]} == on


def test_double_analysis_parses_right_after_the_capture(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    [folder] = run_capture(npu_config(make_config, analysis=True), tmp_path)
    assert call(calls, "tensorboard_trace_handler")["analyse_flag"] is True
    assert (folder / "ASCEND_PROFILER_OUTPUT").is_dir()


def test_double_offline_analyse(calls: Calls, tmp_path: Path) -> None:
    analyse(tmp_path)
    analyse(tmp_path, max_process_number=3)
    assert [kwargs for name, kwargs in calls if name == "analyse"] == [
        {"profiler_path": str(tmp_path), "max_process_number": (os.cpu_count() or 2) // 2},
        {"profiler_path": str(tmp_path), "max_process_number": 3},
    ]


def test_double_captures_list_only_their_own_folder(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    cfg = npu_config(make_config)
    [first] = run_capture(cfg, tmp_path, stem="actor_step1")
    [second] = run_capture(cfg, tmp_path, stem="actor_step2")
    assert first != second
    assert second.name.startswith("actor_step2_")


def test_double_stage_range_ends_when_the_stage_raises(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    tool = make_tool(npu_config(make_config))
    with pytest.raises(ValueError, match="boom"), tool.stage("update_actor"):
        raise ValueError("boom")
    assert [name for name, _ in calls] == ["range_start", "range_end"]


def test_double_missing_folder_is_noted_and_stop_is_guarded(
    calls: Calls, make_config: MakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = sys.modules["torch_npu.profiler"]
    # torch_npu prints and swallows errors in its trace handler: model that as a no-op.
    monkeypatch.setattr(prof, "tensorboard_trace_handler", lambda *a, **k: lambda p: None)
    tool = make_tool(npu_config(make_config))
    with pytest.raises(RuntimeError, match="no npu capture is active"):
        tool.stop()
    tool.start(tmp_path, "s")
    with pytest.raises(RuntimeError, match="already active"):
        tool.start(tmp_path, "t")
    assert tool.stop() == []
    assert tool.note == "torch_npu wrote no *_ascend_pt folder (see its output)"


def test_double_npu_analyse_command_runs_the_offline_analysis(
    calls: Calls, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aprof npu-analyse`` over a save_path with raw captures calls torch_npu's analyse once."""
    (tmp_path / "step_1" / "actor" / "rank_0" / "host_1_2_ascend_pt").mkdir(parents=True)
    assert main(["npu-analyse", str(tmp_path), "--workers", "2"]) == 0
    assert [kwargs for name, kwargs in calls if name == "analyse"] == [
        {"profiler_path": str(tmp_path), "max_process_number": 2}
    ]
    assert "analysed 1 capture folder(s)" in capsys.readouterr().out


def test_npu_analyse_command_errors_are_one_line(tmp_path: Path) -> None:
    """Without torch_npu, or without raw captures, the command says so in one line."""
    (tmp_path / "x_ascend_pt").mkdir()
    for argv, expected in (
        ([str(tmp_path / "missing")], "not a folder"),
        ([str(tmp_path / "x_ascend_pt" / ".."), "--workers", "0"], "--workers must be >= 1"),
        ([str(tmp_path)], "npu needs torch_npu"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "aprof", "npu-analyse", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1 and expected in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "aprof", "npu-analyse", str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "no *_ascend_pt capture folder inside" in done.stderr
