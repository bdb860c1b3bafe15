"""``aprof report``: what a real ``aprof demo`` run (reference servers, a trainer, the driver's
timeline) captured, read back step by step, and what damaged or hostile inputs cost."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aprof
from aprof._accounting import Ledger
from aprof._report import StepReport, build, collect, render
from aprof._report import clock as _report_clock
from aprof._report.model import SAMPLE, Distribution, Interval, distribution
from aprof._report.text import WIDTH

pytest.importorskip("torch")  # the demo's servers and trainer run torch
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(demo_run: Path) -> Path:
    """The shared demo run (read only)."""
    return demo_run


@pytest.fixture
def run(demo: Path, tmp_path: Path) -> Path:
    """A copy of the demo's run, to damage."""
    copy = tmp_path / "run"
    shutil.copytree(demo, copy)
    return copy


def read(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def timeline_requests(save_path: Path) -> list[dict[str, Any]]:
    """The args of every request span on the run's timelines."""
    found = []
    for entry in aprof.load_manifest(save_path).timeline:
        for event in read(save_path / entry.path)["traceEvents"]:
            if event.get("cat") == "request" and event.get("ph") == "b":
                found.append(event["args"])
    return found


def worker_trace(save_path: Path, step: int, replica: int) -> str:
    manifest = aprof.load_manifest(save_path)
    window = manifest.window(step, f"replica_{replica}")
    assert window is not None
    (path,) = [
        f.path
        for f in window.files
        if f.path.endswith(".pt.trace.json.gz") and "async_llm" not in f.path
    ]
    return path


def edit_step(save_path: Path, step: int, change: Any) -> None:
    file = save_path / "manifest" / f"step_{step}.json"
    doc = json.loads(file.read_text())
    change(doc)
    file.write_text(json.dumps(doc))


def test_requests_are_counted_by_step_and_capture(demo: Path) -> None:
    report = collect(demo)
    requests = timeline_requests(demo)
    assert [s.step for s in report.steps] == [1, 2]
    for step in report.steps:
        mine = [r for r in requests if r["step"] == step.step]
        captured = [r for r in mine if r["captured"]]
        assert step.latency_captured.count == len(captured)
        assert step.latency_uncaptured.count == len(mine) - len(captured)
        assert step.latency_captured.count + step.latency_uncaptured.count == len(mine) > 0
        # The demo leaves its last replica uncaptured, and each capture ends after its forward
        # steps, the later requests to its replica uncaptured: both kinds in every step.
        assert not any(r["captured"] for r in mine if r["replica"] == 2)
        assert step.latency_uncaptured.count > sum(r["replica"] == 2 for r in mine) > 0
        assert step.latency_captured.count > 0
        for found in (step.latency_captured, step.latency_uncaptured):
            assert all(value > 0 for value in found.sample)
            if found.count:
                assert found.p50 is not None and found.p95 is not None and found.p99 is not None
                assert 0 < found.p50 <= found.p95 <= found.p99
        assert step.problems == ()
    profiled = [r for r in requests if r["step"] in (1, 2)]
    assert report.latency_profiled.count == len(profiled)
    assert report.latency_unprofiled.count == len(requests) - len(profiled) > 0
    assert report.problems == () and report.html is None


def test_gated_wait_is_one_per_gated_request(demo: Path) -> None:
    report = collect(demo)
    manifest = aprof.load_manifest(demo)
    requests = timeline_requests(demo)
    for step in report.steps:
        gated = [r for r in requests if r["step"] == step.step and r["gated"]]
        assert step.gated_wait.count == len(gated) > 0
        # The manifest counts the same gated requests per window.
        assert len(gated) == sum(w.requests.gated for w in manifest.windows if w.step == step.step)
        assert all(value >= 0 for value in step.gated_wait.sample)


def test_iterations_are_the_forward_steps_in_the_worker_traces(demo: Path) -> None:
    report = collect(demo)
    manifest = aprof.load_manifest(demo)
    for step in report.steps:
        assert set(step.iterations) == {"replica_0", "replica_1"}
        for replica in (0, 1):
            events = read(demo / worker_trace(demo, step.step, replica))["traceEvents"]
            forward = [
                e["dur"] / 1e6
                for e in events
                if e.get("ph") == "X" and str(e.get("name")).startswith("forward_step#")
            ]
            window = manifest.window(step.step, f"replica_{replica}")
            assert window is not None
            found = step.iterations[f"replica_{replica}"]
            assert found.count == len(forward) == window.forward_steps.observed == 8
            assert sorted(found.sample) == pytest.approx(sorted(forward))
        # The trainer's stage: one update_policy per step (one rank).
        assert set(step.stages) == {"trainer · update_policy"}
        assert step.stages["trainer · update_policy"].count == 1
        rows = {row.target: row for row in step.windows}
        assert rows["replica_0"].requested == rows["replica_0"].observed == 8
        assert rows["trainer"].kind == "role" and rows["trainer"].files == 1


def test_a_failed_window_and_a_truncated_trace_are_problems_and_the_rest_is_reported(
    run: Path,
) -> None:
    def fail(doc: dict[str, Any]) -> None:
        for window in doc["windows"]:
            if window["target"] == "replica_1":
                window["state"], window["error"] = "failed", "the server died"
                window["forward_steps"]["observed"] = 5
            if window["target"] == "trainer":
                window["captures"][0]["state"] = "failed"
                window["captures"][0]["error"] = "end failed: boom"

    edit_step(run, 1, fail)
    worker = worker_trace(run, 1, 0)
    data = (run / worker).read_bytes()
    (run / worker).write_bytes(data[: len(data) // 2])  # a run killed mid-write

    report = collect(run)
    one, two = report.steps
    assert one.problems[:3] == (
        "replica_1: failed: the server died",
        "trainer rank 0: capture failed: end failed: boom",
        "replica_1: 5 forward steps observed, 8 requested",
    )
    # Cut mid-write: what came before the cut is read, and the problem says where it ended.
    (cut,) = [p for p in one.problems if p.startswith(f"{worker}: ")]
    assert re.fullmatch(
        re.escape(worker) + r": cut short after \d+ events: truncated \(the compressed stream "
        r"ends early\)",
        cut,
    )
    # The rest is still there: replica_1's iterations, every latency, step 2 whole.
    assert one.iterations["replica_1"].count == 8
    assert one.iterations.get("replica_0", Distribution()).count < 8
    assert one.latency_captured.count + one.latency_uncaptured.count > 0
    assert one.gated_wait.count > 0 and two.problems == ()
    text = render(report)
    assert text.index("problems (4):") < text.index("step 1\n")
    assert "! step 1: replica_1: failed: the server died" in text


def test_timeline_problems_are_the_run_s(run: Path) -> None:
    listing = json.loads((run / "manifest.json").read_text())
    (entry,) = [e for e in listing["timeline"] if e["process"].startswith("driver-")]
    entry["dropped"] = 7
    listing["notes"] = [{"step": None, "target": None, "text": "the manifest could not be written"}]
    (run / "manifest.json").write_text(json.dumps(listing))
    report = collect(run)
    assert report.problems == (
        "the manifest could not be written",
        f"{entry['path']}: 7 timeline events dropped (raise timeline.buffer_events)",
    )
    assert report.steps[0].latency_captured.count > 0  # the timeline is still read

    (run / entry["path"]).unlink()
    report = collect(run)
    assert f"{entry['path']}: timeline unreadable: missing" in report.problems
    # The step's detail is the timeline's; the run-wide counts, the ledgers' beside it.
    assert report.steps[0].latency_captured.count == 0
    assert report.latency_profiled.count == collect(run).latency_profiled.count > 0
    # Without the timeline the capture's start is unknown: no gated wait, nor a made-up one.
    assert report.steps[0].gated_wait.count == 0
    assert report.steps[0].iterations["replica_0"].count == 8


def test_no_link_below_save_path_is_followed(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text('{"traceEvents": []}')
    worker = worker_trace(run, 2, 1)
    (run / worker).unlink()
    (run / worker).symlink_to(outside)
    (step,) = [s for s in collect(run).steps if s.step == 2]
    assert step.problems == (f"{worker}: unreadable: a link: not followed below save_path",)
    assert "replica_1" not in step.iterations


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
EVENT_KEYS = st.sampled_from(
    ["ph", "name", "pid", "tid", "ts", "dur", "id", "id2", "args", "cat", "step", "local"]
)
EVENTS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "ph": st.sampled_from(["b", "e", "n", "X", "M"]) | JSON_VALUES,
            "cat": st.sampled_from(["request", "capture", "user_annotation"]) | JSON_VALUES,
            "name": st.sampled_from(["starting", "forward_step#1", "update_policy"]) | JSON_VALUES,
            "id2": st.fixed_dictionaries({"local": JSON_VALUES}) | JSON_VALUES,
            "args": st.fixed_dictionaries(
                {},
                optional={
                    "step": st.sampled_from([1, 2, 3]) | JSON_VALUES,
                    "replica": st.sampled_from([0, 1]) | JSON_VALUES,
                    "gated": JSON_VALUES,
                    "captured": JSON_VALUES,
                    "target": st.sampled_from(["replica_0", "replica_1"]) | JSON_VALUES,
                },
            )
            | JSON_VALUES,
            "ts": JSON_VALUES,
            "dur": JSON_VALUES,
        },
    )
    | st.dictionaries(EVENT_KEYS, JSON_VALUES, max_size=6)
    | JSON_VALUES,
    max_size=12,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    events=EVENTS,
    base=st.none() | st.integers() | st.floats() | st.text(max_size=4),
    whole=st.none() | JSON_VALUES,
)
def test_any_json_in_a_trace_or_timeline_never_raises(
    demo: Path, tmp_path: Path, events: list[Any], base: Any, whole: Any
) -> None:
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(demo, run)
    doc: Any = {"traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    if whole is not None:
        doc = whole  # not even a trace object
    (entry,) = [e for e in aprof.load_manifest(run).timeline if e.process.startswith("driver-")]
    for path in (worker_trace(run, 1, 0), entry.path):
        with gzip.open(run / path, "wt") as f:
            json.dump(doc, f)  # NaN and Infinity too: Python's json writes them

    report = collect(run)
    assert [s.step for s in report.steps] == [1, 2]
    assert report.steps[1].iterations["replica_0"].count == 8  # not written over
    render(report)


def test_the_text_puts_problems_first_and_fits_the_width(run: Path) -> None:
    text = render(collect(run))
    lines = text.splitlines()
    assert lines[1] == "problems: none"
    assert all(len(line) <= WIDTH for line in lines)
    assert "  latency     captured    n=" in text and "iteration   replica_1" in text
    assert "stage       trainer · update_policy" in text
    assert "latency p50 of profiled vs unprofiled steps: " in text

    edit_step(run, 2, lambda doc: doc["windows"][0].update(state="skipped", error="x" * 300))
    lines = render(collect(run)).splitlines()
    assert lines[1] == "problems (1):" and lines[2].startswith("  ! step 2: ")
    assert all(len(line) <= WIDTH for line in lines)


def test_the_command_line(run: Path, tmp_path: Path) -> None:
    def aprof_report(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "aprof", "report", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    (run / "report.html").unlink()  # the demo's
    done = aprof_report(str(run), "--no-html")
    assert done.returncode == 0, done.stderr
    assert done.stdout == render(collect(run)) and done.stderr == ""
    assert not (run / "report.html").exists()

    done = aprof_report(str(run))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"report: {run / 'report.html'}"
    assert (run / "report.html").is_file()

    for args, line in [
        ((str(tmp_path / "none"),), "cannot read"),
        ((str(tmp_path / "none"), "--no-html"), "cannot read"),
    ]:
        bad = aprof_report(*args)
        assert bad.returncode == 1 and bad.stdout == ""
        assert bad.stderr.startswith("aprof report: ") and line in bad.stderr
        assert bad.stderr.count("\n") == 1


def test_report_from_python_writes_the_html(run: Path) -> None:
    (run / "report.html").unlink()  # the demo's
    made = aprof.report(run)
    assert made.html == run / "report.html" and made.html.is_file()
    assert aprof.report(run, html=False).html is None


def test_percentiles_are_nearest_rank_and_the_sample_is_bounded() -> None:
    found = distribution([float(v) for v in range(100, 0, -1)])
    assert (found.count, found.p50, found.p95, found.p99) == (100, 50.0, 95.0, 99.0)
    assert found.sample == tuple(float(v) for v in range(1, 101))
    empty = distribution([])
    assert (empty.count, empty.p50, empty.sample) == (0, None, ())

    many = distribution([float(v) for v in range(10 * SAMPLE)])
    assert len(many.sample) == SAMPLE
    assert many.sample[0] == 0.0 and many.sample[-1] == 10 * SAMPLE - 1
    assert list(many.sample) == sorted(many.sample)


def test_the_run_wide_distributions_keep_a_bounded_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(build, "RUN_VALUES", 100)
    ledger = Ledger()
    for step in range(1, 101):  # 100 requests a step, latencies 1 ms ... 10 s
        for i in range(100):
            latency_ns = ((step - 1) * 100 + i + 1) * 1_000_000
            ledger.request(
                0,
                latency_ns,
                step=step,
                replica=0,
                request_id=None,
                tokens=0,
                prompt_tokens=0,
                gated=False,
                process="p",
            )
    profiled, unprofiled = build._run_latencies(ledger, {1, 2})
    assert profiled.count == 200 and unprofiled.count == 9_800
    assert len(unprofiled.sample) <= 100 and profiled.p99 is not None
    assert unprofiled.p50 is not None and 2.5 < unprofiled.p50 < 7.5  # a uniform sample's
    assert build._run_latencies(ledger, {1, 2}) == (profiled, unprofiled)  # seeded


def test_the_demo_goes_on_when_the_report_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aprof.cli.demo import _print_report

    _print_report(tmp_path / "no run")
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("report: none (ManifestError: ")


def step_spans(save_path: Path) -> dict[int, tuple[int, int]]:
    """Each step's slice on the driver's timeline, wall-clock ns."""
    found = {}
    for entry in aprof.load_manifest(save_path).timeline:
        doc = read(save_path / entry.path)
        for event in doc["traceEvents"]:
            if event.get("cat") == "step" and event.get("ph") == "X":
                begin = doc["baseTimeNanoseconds"] + event["ts"] * 1000
                found[event["args"]["step"]] = (begin, begin + event["dur"] * 1000)
    return found


def test_each_step_on_one_clock_has_its_windows_requests_forward_steps_and_ranks(
    demo: Path,
) -> None:
    report = collect(demo)
    manifest = aprof.load_manifest(demo)
    requests = timeline_requests(demo)
    spans = step_spans(demo)
    for step in report.steps:
        windows = [w for w in manifest.windows if w.step == step.step]
        rows = {row.name: row for row in step.timeline}
        assert list(rows) == [
            f"step {step.step}",
            *(f"{w.target} · window" for w in windows),
            "requests → replica_0",
            "replica_0 · iterations",
            "requests → replica_1",
            "replica_1 · iterations",
            "requests → replica_2",  # not captured: no forward steps
            "trainer · rank 0",
        ]
        assert [row.kind for row in step.timeline] == [
            "step",
            *(["window"] * len(windows)),
            *(["requests", "iterations"] * 2),
            "requests",
            "ranges",
        ]
        assert all(row.left_out == 0 for row in step.timeline)
        begin, end = spans[step.step]
        (span,) = rows[f"step {step.step}"].items
        assert abs(span.begin_ns - begin) < 1000 and abs(span.end_ns - end) < 1000
        table = {row.target: row for row in step.windows}
        for w in windows:
            (item,) = rows[f"{w.target} · window"].items
            assert (item.begin_ns, item.state) == (w.started_ns, w.state)
            if w.kind == "role":  # ended by aprof, at the step's end
                assert item.end_ns == w.stopped_ns and table[w.target].ended_ns is None
                continue
            # Auto-stopped by the server after its 8 forward steps: the window's capture
            # ended with the last of them, well before aprof recorded the stop (the step's end).
            assert w.stop_reason == "auto_stop"
            last = max(i.end_ns for i in rows[f"{w.target} · iterations"].items)
            assert item.end_ns == table[w.target].ended_ns == last
            assert table[w.target].capture_end_ns == last
            assert w.started_ns is not None and w.stopped_ns is not None
            assert w.started_ns < last < w.stopped_ns
        for replica in (0, 1):
            mine = [r for r in requests if r["step"] == step.step and r["replica"] == replica]
            drawn = rows[f"requests → replica_{replica}"].items
            assert len(drawn) == len(mine) > 0
            assert sorted(i.label.split(" ")[1] for i in drawn) == sorted(
                r["request_id"] for r in mine
            )
            assert [i.state for i in drawn].count("captured") == sum(r["captured"] for r in mine)
            for item in drawn:  # within the step, to the µs the timeline keeps
                assert begin - 1000 <= item.begin_ns <= item.end_ns <= end + 1000
            window = manifest.window(step.step, f"replica_{replica}")
            assert window is not None and window.started_ns and window.stopped_ns
            forward = rows[f"replica_{replica} · iterations"].items
            assert len(forward) == window.forward_steps.observed == 8
            assert all(i.label.startswith("forward_step#") for i in forward)
            assert [i.begin_ns for i in forward] == sorted(i.begin_ns for i in forward)
            # The worker's clock and the driver's agree (one host): inside the window.
            assert window.started_ns - 50_000_000 <= forward[0].begin_ns
            assert forward[-1].end_ns <= window.stopped_ns + 50_000_000
            # Drawn: begin and end each rounded to the ns; the duration is the trace's own.
            durations = sorted((i.end_ns - i.begin_ns) / 1e9 for i in forward)
            sample = sorted(step.iterations[f"replica_{replica}"].sample)
            assert durations == pytest.approx(sample, abs=2e-9)
        (stage,) = rows["trainer · rank 0"].items
        assert stage.label == "update_policy"
        assert (stage.end_ns - stage.begin_ns) / 1e9 == pytest.approx(
            step.stages["trainer · update_policy"].sample[0], abs=1e-6
        )
        trainer = manifest.window(step.step, "trainer")
        assert trainer is not None and trainer.started_ns and trainer.stopped_ns
        assert trainer.started_ns <= stage.begin_ns <= stage.end_ns <= trainer.stopped_ns


def test_a_step_on_one_clock_keeps_its_earliest_items(
    demo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def capped(step: StepReport) -> list[tuple[int, str, Interval]]:
        """The step's requests, forward steps and ranges, earliest first."""
        items = [
            (item.begin_ns, row.name, item)
            for row in step.timeline
            if row.kind in ("requests", "iterations", "ranges")
            for item in row.items
        ]
        return sorted(items, key=lambda found: found[0])

    whole = collect(demo)
    monkeypatch.setattr(_report_clock, "TIMELINE_ITEMS", 3)
    cut = collect(demo)
    for full, three in zip(whole.steps, cut.steps, strict=True):
        every = capped(full)
        assert capped(three) == every[:3]
        assert sum(row.left_out for row in three.timeline) == len(every) - 3 > 40
        # The step and its windows are always there; the numbers count every item.
        assert [r for r in three.timeline if r.kind in ("step", "window")] == [
            r for r in full.timeline if r.kind in ("step", "window")
        ]
        assert three.iterations == full.iterations and three.stages == full.stages
