"""The nsys tool against a double of torch's CUDA profiler and NVTX calls; its command builders.

This machine has no CUDA and no nsys, so ``torch.cuda.cudart()``, ``torch.cuda.synchronize``
and ``torch.cuda.nvtx.range_push``/``range_pop`` are replaced by a double with the real names
and signatures that records each call. Like nsys with ``--capture-range-end=repeat``, the double
writes a report after a capture range ends: at once, or in chunks from a writer thread, each
chunk when a test tells it to (between two looks of the tool's stop at the report folder).
"""

from __future__ import annotations

import inspect
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import aprof
from aprof.tools import make_tool
from aprof.tools import nsys as nsys_module
from aprof.tools.nsys import is_report_of, nsys_command, ray_nsight_runtime_env, report_dir

torch = pytest.importorskip("torch")

MakeConfig = Callable[..., aprof.ProfilerConfig]
PID = os.getpid()


class ReportWriter:
    """nsys's report writer as a thread: appends a chunk to a report each time it is told."""

    def __init__(self) -> None:
        self._orders: queue.Queue[tuple[Path, bytes] | None] = queue.Queue()
        self._written: queue.Queue[Path] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="nsys-writer", daemon=True)
        self._thread.start()

    def write(self, path: Path, chunk: bytes) -> None:
        """Tell the writer to append ``chunk`` to ``path``; return once it has."""
        self._orders.put((path, chunk))
        assert self._written.get(timeout=10) == path

    def close(self) -> None:
        self._orders.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while (order := self._orders.get()) is not None:
            path, chunk = order
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as f:
                f.write(chunk)
            self._written.put(path)


class CudaProfilerDouble:
    """Mirrors ``cudart()``'s profiler calls and NVTX; ``calls`` lists them in order."""

    def __init__(self, reports: Path) -> None:
        self.reports = reports
        self.calls: list[str] = []
        self.status = 0  # cudaError.success
        self.write_at_stop = True  # False: the test drives the writer
        self.ranges = 0

    def report(self, range_number: int, pid: int = PID) -> Path:
        """The report nsys writes for a range (``-o worker_%p``, ranges numbered from 1)."""
        return self.reports / f"worker_{pid}.{range_number}.nsys-rep"

    def cudart(self) -> CudaProfilerDouble:
        return self

    def cudaProfilerStart(self) -> int:
        self.calls.append("cudaProfilerStart")
        return self.status

    def cudaProfilerStop(self) -> int:
        self.calls.append("cudaProfilerStop")
        if self.status == 0:
            self.ranges += 1
            if self.write_at_stop:
                self.reports.mkdir(parents=True, exist_ok=True)
                self.report(self.ranges).write_bytes(b"report")
        return self.status

    def synchronize(self, device: object = None) -> None:
        self.calls.append("synchronize")

    def range_push(self, msg: str) -> None:
        self.calls.append(f"range_push {msg}")

    def range_pop(self) -> None:
        self.calls.append("range_pop")


class Looks:
    """Stands in for the pause between two looks of the tool at the report folder.

    Each pause runs the next queued action (telling the writer to write a chunk, say); with
    none left it returns at once. ``count`` is the number of pauses so far.
    """

    def __init__(self) -> None:
        self.actions: list[Callable[[], None]] = []
        self.count = 0

    def __call__(self, seconds: float) -> None:
        assert 0 < seconds <= nsys_module.POLL_S
        self.count += 1
        if self.actions:
            self.actions.pop(0)()


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


@pytest.fixture(autouse=True)
def looks(monkeypatch: pytest.MonkeyPatch) -> Looks:
    gate = Looks()
    monkeypatch.setattr(nsys_module, "_pause", gate)
    return gate


@pytest.fixture
def writer() -> Iterator[ReportWriter]:
    thread = ReportWriter()
    yield thread
    thread.close()


def nsys_config(make_config: MakeConfig, reports: Path, **nsys: object) -> aprof.ProfilerConfig:
    return make_config(
        global_profiler={"tool": "nsys"},
        tool_config={"nsys": {"output_dir": str(reports), **nsys}},
    )


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
    tool = make_tool(nsys_config(make_config, reports))
    tool.start(tmp_path / "step_1", "actor_step1")
    with tool.stage("update_actor"), tool.stage("update_actor/forward"):
        pass
    assert tool.stop() == [double.report(1)]
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
    assert tool.stop() == [double.report(2)]


def test_double_stop_waits_until_the_report_is_written_and_stops_growing(
    double: CudaProfilerDouble,
    reports: Path,
    make_config: MakeConfig,
    tmp_path: Path,
    looks: Looks,
    writer: ReportWriter,
) -> None:
    """nsys writes the report after the range ends: stop lists it only once it is whole."""
    double.write_at_stop = False
    report = double.report(1)
    looks.actions = [
        lambda: None,  # the first look finds nothing yet
        lambda: writer.write(report, b"a" * 100),
        lambda: writer.write(report, b"b" * 50),  # still growing at the next look
        lambda: writer.write(report, b"c" * 25),
    ]
    tool = make_tool(nsys_config(make_config, reports))
    tool.start(tmp_path, "actor_step1")
    assert tool.stop() == [report]
    assert report.stat().st_size == 175  # every chunk was in before stop returned
    assert looks.count == 5  # the last look saw the same size as the one before
    assert tool.note is None


def test_double_stop_lists_only_this_process_reports(
    double: CudaProfilerDouble,
    reports: Path,
    make_config: MakeConfig,
    tmp_path: Path,
    looks: Looks,
    writer: ReportWriter,
) -> None:
    """Ranks sharing a report folder: another pid's report is neither listed nor waited for."""
    double.write_at_stop = False
    other = double.report(1, pid=PID + 1)
    mine = double.report(1)
    looks.actions = [
        lambda: writer.write(other, b"another rank's report"),
        lambda: None,  # only the other report is there: keep looking
        lambda: writer.write(mine, b"this rank's report"),
    ]
    tool = make_tool(nsys_config(make_config, reports))
    tool.start(tmp_path, "actor_step1")
    assert tool.stop() == [mine]
    assert looks.count == 4


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        (f"worker_{PID}.nsys-rep", True),
        (f"worker_{PID}.3.nsys-rep", True),
        (f"actor_2_{PID}.nsys-rep", True),
        (f"worker_{PID + 1}.1.nsys-rep", False),
        (f"worker_1{PID}.nsys-rep", False),
        ("report.nsys-rep", True),  # -o without %p: one process per folder
        ("report.12.nsys-rep", True),
    ],
)
def test_report_names_are_matched_to_the_process(name: str, ours: bool) -> None:
    assert PID >= 100  # a process id long enough to tell from a range number
    assert is_report_of(name, PID) is ours


def test_double_report_not_written_within_finalize_s_is_noted(
    double: CudaProfilerDouble, reports: Path, make_config: MakeConfig, tmp_path: Path
) -> None:
    double.write_at_stop = False
    tool = make_tool(nsys_config(make_config, reports, finalize_s=0.05))
    tool.start(tmp_path, "s")
    assert tool.stop() == []
    assert tool.note == (
        f"nsys report not finalised within finalize_s (0.05 s): no report appeared in {reports}"
    )


def test_double_report_still_growing_at_finalize_s_is_listed_and_noted(
    double: CudaProfilerDouble,
    reports: Path,
    make_config: MakeConfig,
    tmp_path: Path,
    looks: Looks,
    writer: ReportWriter,
) -> None:
    double.write_at_stop = False
    report = double.report(1)

    def grow() -> None:
        writer.write(report, b"x")
        looks.actions.append(grow)  # every pause writes more: the size never holds still

    looks.actions = [grow]
    tool = make_tool(nsys_config(make_config, reports, finalize_s=0.05))
    tool.start(tmp_path, "s")
    assert tool.stop() == [report]
    assert tool.note == (
        f"nsys report not finalised within finalize_s (0.05 s): the report was still growing "
        f"in {reports}"
    )


def test_double_stage_range_is_popped_when_the_stage_raises(
    double: CudaProfilerDouble, make_config: MakeConfig
) -> None:
    tool = make_tool(make_config(global_profiler={"tool": "nsys"}))
    with pytest.raises(ValueError, match="boom"), tool.stage("update_actor"):
        raise ValueError("boom")
    assert double.calls == ["range_push update_actor", "range_pop"]


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


def test_nsys_command_and_ray_options_keep_the_users_other_options(
    make_config: MakeConfig,
) -> None:
    options = {"cuda-memory-usage": "true", "cuda-graph-trace": "node", "kill": "none"}
    cfg = make_config(tool_config={"nsys": {"options": options}}).tool_config.nsys
    assert nsys_command(cfg, ["python", "w.py"], output="/r/w_%p") == [
        "nsys",
        "profile",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat",
        "--trace=cuda,nvtx",
        "--cuda-memory-usage=true",
        "--cuda-graph-trace=node",
        "--kill=none",
        "-o",
        "/r/w_%p",
        "python",
        "w.py",
    ]
    assert ray_nsight_runtime_env(cfg, "/r/w_%p") == {
        "capture-range": "cudaProfilerApi",
        "capture-range-end": "repeat",
        "t": "cuda,nvtx",
        "o": "/r/w_%p",
        **options,
    }


@pytest.mark.parametrize(
    ("options", "key", "reason"),
    [
        ({"capture-range-end": "repeat-shutdown:6"}, "capture-range-end", "set by aprof itself"),
        ({"trace": "cuda"}, "trace", "tool_config.nsys.trace"),
        ({"output": "x"}, "output", "tool_config.nsys.output_dir"),
        ({"capture-range": "nvtx"}, "capture-range", "cudaProfilerApi"),
        ({"--kill": "none"}, "--kill", "long option name"),
        ({"o": "x"}, "o", "at least two characters"),
        ({"Kill": "none"}, "Kill", "long option name"),
        ({"kill": "sig term"}, "kill", "without whitespace"),
        ({"kill": ""}, "kill", "without whitespace"),
        ({"kill": True}, "kill", "expected a string"),
    ],
)
def test_nsys_options_are_checked(
    make_config: MakeConfig, options: dict[str, object], key: str, reason: str
) -> None:
    with pytest.raises(aprof.ConfigError, match=reason) as err:
        make_config(tool_config={"nsys": {"options": options}})
    assert err.value.key == f"tool_config.nsys.options.{key}"


def test_nsys_options_count_is_bounded(make_config: MakeConfig) -> None:
    many = {f"opt-{i}": "x" for i in range(65)}
    with pytest.raises(aprof.ConfigError, match="at most 64 options") as err:
        make_config(tool_config={"nsys": {"options": many}})
    assert err.value.key == "tool_config.nsys.options"


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
