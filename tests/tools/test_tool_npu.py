"""The npu tool against a double of torch_npu (no Ascend NPU or CANN here).

The double is installed as ``sys.modules["torch_npu"]``. Its names, signatures, constants and
behaviour follow the torch_npu 2.13/2.14 wheel as the workers reference note records it:
``profiler.profile`` (keyword-only), ``_ExperimentalConfig``, ``tensorboard_trace_handler``
(which names the ``<worker_name>_<pid>_<timestamp>_ascend_pt/`` folder and parses it when the
trace is ready), ``profiler.schedule`` (``Schedule(wait, active, warmup, repeat, skip_first,
skip_first_wait)``: not torch's order) with ``ProfilerAction``, ``profiler.profiler.analyse``
and ``npu.mstx.range_start``/``range_end``. Like torch_npu, ``profile`` moves between
schedule actions by its action table: a folder is made when a cycle begins, the trace is
handed to ``on_trace_ready`` when a recorded cycle ends (or a stop cuts it), and a stop during
warmup deletes the cycle's folder.
"""

from __future__ import annotations

import enum
import itertools
import os
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Callable
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


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class DoubleOptions:
    """Knobs of the double: ``make_folders`` False models torch_npu failing (and swallowing
    the error) to create its data folder."""

    make_folders = True


A = ProfilerAction
ACTIONS: dict[tuple[ProfilerAction, ProfilerAction | None], list[str]] = {
    # torch_npu's ProfActionController table (warnings left out): (previous, current) -> steps.
    (A.NONE, A.WARMUP): ["init_trace", "warmup_trace"],
    (A.NONE, A.RECORD): ["init_trace", "start_trace"],
    (A.NONE, A.RECORD_AND_SAVE): ["init_trace", "start_trace"],
    (A.WARMUP, A.NONE): ["start_trace", "stop_trace", "finalize_trace"],
    (A.WARMUP, A.RECORD): ["start_trace"],
    (A.WARMUP, A.RECORD_AND_SAVE): ["start_trace"],
    (A.RECORD, A.NONE): ["stop_trace", "finalize_trace"],
    (A.RECORD, A.WARMUP): ["stop_trace", "finalize_trace"],
    (A.RECORD_AND_SAVE, A.NONE): ["stop_trace", "finalize_trace", "trace_ready"],
    (A.RECORD_AND_SAVE, A.WARMUP): [
        "stop_trace",
        "finalize_trace",
        "trace_ready",
        "init_trace",
        "warmup_trace",
    ],
    (A.RECORD_AND_SAVE, A.RECORD): [
        "stop_trace",
        "finalize_trace",
        "trace_ready",
        "init_trace",
        "start_trace",
    ],
    (A.RECORD_AND_SAVE, A.RECORD_AND_SAVE): [
        "stop_trace",
        "finalize_trace",
        "trace_ready",
        "init_trace",
        "start_trace",
    ],
    (A.WARMUP, None): ["finalize_trace", "delete_prof_dir"],
    (A.RECORD, None): ["stop_trace", "finalize_trace", "trace_ready"],
    (A.RECORD_AND_SAVE, None): ["stop_trace", "finalize_trace", "trace_ready"],
}


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

    paths: dict[str, str | None] = {"dir_name": None, "worker_name": None}  # ProfPathCreator
    stamps = itertools.count(20260101000000000)  # one folder per millisecond at most

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
        # Like torch_npu: the names take effect for the folders made from now on.
        paths.update(dir_name=dir_name, worker_name=worker_name)

        def handler(prof: Any) -> None:
            calls.append(("trace_ready", {}))
            if analyse_flag and prof.folder is not None:
                (prof.folder / "ASCEND_PROFILER_OUTPUT").mkdir()

        return handler

    class Schedule:
        def __init__(
            self,
            wait: int,
            active: int,
            warmup: int = 0,
            repeat: int = 0,
            skip_first: int = 0,
            skip_first_wait: int = 0,
        ) -> None:
            given = {
                "wait": wait,
                "active": active,
                "warmup": warmup,
                "repeat": repeat,
                "skip_first": skip_first,
                "skip_first_wait": skip_first_wait,
            }
            calls.append(("schedule", given))
            self.wait, self.active, self.warmup = wait, active, warmup
            self.repeat, self.skip_first = repeat, skip_first

        def __call__(self, step: int) -> ProfilerAction:
            if step < self.skip_first:
                return A.NONE
            step -= self.skip_first
            length = self.wait + self.warmup + self.active
            if self.repeat > 0 and step / length >= self.repeat:
                return A.NONE
            position = step % length
            if position < self.wait:
                return A.NONE
            if position < self.wait + self.warmup:
                return A.WARMUP
            return A.RECORD if position < length - 1 else A.RECORD_AND_SAVE

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
            # No schedule: torch_npu records from start to stop.
            self.schedule = schedule if callable(schedule) else (lambda step: A.RECORD)
            self.on_trace_ready = on_trace_ready
            self.step_num = 0
            self.current_action = self.schedule(0)
            self.folder: Path | None = None

        def start(self) -> None:
            calls.append(("start", {}))
            self._transit(A.NONE, self.current_action)

        def stop(self) -> None:
            calls.append(("stop", {}))
            self._transit(self.current_action, None)

        def step(self) -> None:
            calls.append(("step", {}))
            previous = self.current_action
            self.step_num += 1
            self.current_action = self.schedule(self.step_num)
            self._transit(previous, self.current_action)

        def _transit(self, previous: ProfilerAction, current: ProfilerAction | None) -> None:
            for action in ACTIONS.get((previous, current), []):
                if action == "init_trace" and DoubleOptions.make_folders:
                    name = f"{paths['worker_name']}_{os.getpid()}_{next(stamps)}_ascend_pt"
                    self.folder = Path(str(paths["dir_name"])) / name
                    (self.folder / "FRAMEWORK").mkdir(parents=True)
                    (self.folder / "PROF_000001_20260101000000000_ABC").mkdir()
                    (self.folder / "profiler_metadata.json").write_text("{}")
                elif action == "delete_prof_dir" and self.folder is not None:
                    shutil.rmtree(self.folder)
                elif action == "trace_ready" and self.on_trace_ready is not None:
                    self.on_trace_ready(self)

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
        "schedule": Schedule,
        "ProfilerAction": ProfilerAction,
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
    # torch_npu prints and swallows the error when it cannot make its folder.
    monkeypatch.setattr(DoubleOptions, "make_folders", False)
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


def scheduled_capture(
    cfg: aprof.ProfilerConfig, dir: Path, mini_batches: int, stem: str = "update_actor"
) -> tuple[list[Path], str | None]:
    """A scheduled capture over ``mini_batches`` mini-batches; its folders and note."""
    tool = make_tool(cfg)
    tool.start(dir, stem, scheduled=True)
    for _ in range(mini_batches):
        tool.step()
    return tool.stop(), tool.note


def stems(folders: list[Path]) -> list[str]:
    """The worker-name part of each ``<stem>_<pid>_<timestamp>_ascend_pt`` folder."""
    found = [(FOLDER.fullmatch(f.name), f.name) for f in folders]
    return [m["stem"] if m else name for m, name in found]


SCHEDULE = {"skip_first": 1, "wait": 1, "warmup": 1, "active": 2, "repeat": 2}
"""Mini-batch 0 skipped; cycles: 1 wait, 2 warmup, 3-4 active; 5 wait, 6 warmup, 7-8 active."""


def test_double_schedule_goes_to_torch_npu_schedule_by_name(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    """torch_npu's Schedule takes (wait, active, warmup, ...): each value reaches its name."""
    scheduled_capture(npu_config(make_config, schedule=SCHEDULE), tmp_path, 0)
    assert call(calls, "schedule") == {
        "wait": 1,
        "active": 2,
        "warmup": 1,
        "repeat": 2,
        "skip_first": 1,
        "skip_first_wait": 0,
    }
    profile = call(calls, "profile")
    assert profile["schedule"] is not None and profile["on_trace_ready"] is not None


def test_double_each_cycle_gets_its_folder_named_by_mini_batches(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    folders, note = scheduled_capture(
        npu_config(make_config, schedule=SCHEDULE, analysis=True), tmp_path, 12
    )
    assert stems(folders) == ["update_actor-mb3-4", "update_actor-mb7-8"]
    assert sorted(tmp_path.iterdir()) == folders  # warmup-only folders were not left behind
    assert all((f / "ASCEND_PROFILER_OUTPUT").is_dir() for f in folders)  # parsed per cycle
    assert [name for name, _ in calls].count("trace_ready") == 2
    assert note is None


def test_double_window_ending_in_an_active_cycle_flushes_it(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    folders, note = scheduled_capture(npu_config(make_config, schedule=SCHEDULE), tmp_path, 3)
    assert stems(folders) == ["update_actor-mb3-3"]
    assert note == (
        "schedule cycle cut at mini-batch 3: the window ended inside it (mini-batches 3-3 written)"
    )


@pytest.mark.parametrize("mini_batches", [0, 1, 2])  # skip, wait, warmup
def test_double_window_ending_before_any_active_mini_batch_writes_nothing(
    calls: Calls, make_config: MakeConfig, tmp_path: Path, mini_batches: int
) -> None:
    folders, note = scheduled_capture(
        npu_config(make_config, schedule=SCHEDULE), tmp_path, mini_batches
    )
    assert folders == []
    assert list(tmp_path.iterdir()) == []  # torch_npu deletes a folder stopped in warmup
    assert note == (
        f"the window ended at mini-batch {mini_batches}, before any active mini-batch of the "
        "schedule: no trace written"
    )


def test_double_unscheduled_start_ignores_the_schedule(
    calls: Calls, make_config: MakeConfig, tmp_path: Path
) -> None:
    """A capture of a stage the schedule does not name records from start to stop."""
    tool = make_tool(npu_config(make_config, schedule=SCHEDULE))
    tool.start(tmp_path, "compute_log_prob")
    tool.step()  # nothing to advance
    [folder] = tool.stop()
    assert folder.name.startswith("compute_log_prob_")
    assert call(calls, "profile")["schedule"] is None
    assert "step" not in [name for name, _ in calls]


def test_double_worker_profiler_schedules_the_named_stage_only(
    calls: Calls, make_config: MakeConfig
) -> None:
    from aprof._workers import WorkerProfiler

    cfg = make_config(
        global_profiler={"tool": "npu"},
        roles={"actor": {"discrete": True}},
        tool_config={"npu": {"schedule": {"active": 2, "repeat": 2}}},
    )
    wp = WorkerProfiler(cfg, role="actor", rank=0)
    with wp.global_step(1):
        with wp.stage("compute_log_prob"):
            wp.step()
        with wp.stage("actor_update"):
            for _ in range(4):
                wp.step()
    log_prob, update = wp.captures
    save_path = cfg.global_profiler.save_path
    assert stems([save_path / f.path for f in log_prob.files]) == ["compute_log_prob-step1-rank0"]
    assert stems([save_path / f.path for f in update.files]) == [
        "actor_update-step1-rank0-mb0-1",
        "actor_update-step1-rank0-mb2-3",
    ]
    assert (log_prob.note, update.note) == (None, None)


def test_double_folder_that_cannot_be_renamed_is_listed_under_its_own_name(
    calls: Calls, make_config: MakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refuse)
    folders, note = scheduled_capture(npu_config(make_config, schedule=SCHEDULE), tmp_path, 5)
    assert stems(folders) == ["update_actor"]
    assert note is not None
    assert note.startswith(f"mini-batches 3-4 left in {folders[0].name}: ")
