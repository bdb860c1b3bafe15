"""``aprof merge``: a profiled step of ``aprof demo`` (reference servers, a trainer, the driver's
timeline) merged into one Chrome trace on one clock, and what a damaged input costs."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import aprof
from aprof import merge

pytest.importorskip("torch")  # the demo's servers and trainer run torch
ROOT = Path(__file__).resolve().parents[2]
SKEW_US = 1000
"""How far a forward step may lie outside every request span to its replica (1 ms)."""


@pytest.fixture
def demo(demo_run: Path) -> Path:
    """The shared demo run (read only)."""
    return demo_run


def events_of(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:  # strict: valid UTF-8
        doc = json.load(f, parse_constant=pytest.fail)  # no NaN or Infinity
    return doc["traceEvents"], doc


def processes(events: list[dict[str, Any]]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}


def test_each_step_puts_requests_and_forward_steps_on_one_clock(demo: Path, tmp_path: Path) -> None:
    merged = merge(demo, out=tmp_path)
    assert [m.step for m in merged] == [1, 2]
    for step in merged:
        assert step.path == tmp_path / f"step_{step.step}.trace.json.gz"
        events, doc = events_of(step.path)
        assert doc["aprof"]["step"] == step.step and step.events == len(events)
        names = processes(events)
        assert len(set(names.values())) == len(names)  # each process named once, apart
        labels = set(names.values())
        assert "driver" in labels and "replica_0 · frontend" in labels
        # The trainer rank's timeline named by its role and rank, beside its capture's process.
        assert {"trainer · rank 0", "trainer · rank 0 · python"} <= labels
        assert not any(n.startswith("trainer-") for n in labels)
        # No process of one event: Kineto's tracks (Spans, Traces, the record window's end)
        # are folded into their trace's host process, which keeps its name.
        held = Counter(e["pid"] for e in events if e.get("ph") != "M")
        assert all(held[pid] > 1 for pid in names), (names, held)
        assert not any(n.endswith((" · Spans", " · Traces", " · unnamed")) for n in labels)
        folded = {
            names[e["pid"]]
            for e in events
            if e.get("name") in ("PyTorch Profiler (0)", "Record Window End")
        }
        assert folded == {
            "replica_0 · vLLM worker · python",
            "replica_1 · vLLM worker · python",
            "trainer · rank 0 · python",
        }
        for r in (0, 1):
            assert any(n.startswith(f"replica_{r} · vLLM worker · python") for n in labels)
            spans = request_spans(events, names, r)
            forward = [
                (e["ts"], e["ts"] + e["dur"])
                for e in events
                if names.get(e.get("pid"), "").startswith(f"replica_{r} · vLLM worker")
                and str(e.get("name")).startswith("forward_step#")
            ]
            assert len(forward) == 8  # the window's forward steps (--forward-steps)
            for begin, end in forward:  # each served a request the driver sent that replica
                assert any(s - SKEW_US <= end and begin <= t + SKEW_US for s, t in spans)
        # Only this step's part of the driver's timeline, with every span it begins ended.
        driver = [e for e in events if names.get(e.get("pid")) == "driver" and "args" in e]
        assert {e["args"]["step"] for e in driver if "step" in e["args"]} == {step.step}
        phases = Counter(e["ph"] for e in events if names.get(e.get("pid")) == "driver")
        assert phases["b"] == phases["e"] > 0


def request_spans(
    events: list[dict[str, Any]], names: dict[int, str], replica: int
) -> list[tuple[float, float]]:
    begun: dict[str, float] = {}
    spans = []
    for e in events:
        if names.get(e.get("pid")) == "driver" and e.get("name") == f"request replica_{replica}":
            key = e["id2"]["local"]
            if e["ph"] == "b":
                begun[key] = e["ts"]
            elif e["ph"] == "e":
                spans.append((begun.pop(key), e["ts"]))
    assert spans and not begun
    return spans


def test_a_failed_window_and_damaged_inputs_are_named_and_the_rest_merged(
    demo: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(demo, run)
    manifest = aprof.load_manifest(run)
    files = [f.path for w in manifest.windows if w.step == 1 for f in w.files]
    traces = [p for p in files if p.endswith(".pt.trace.json.gz")]
    worker = next(p for p in traces if "async_llm" not in p and "replica_0" in p)
    frontend = next(p for p in traces if "async_llm" in p and "replica_1" in p)
    data = (run / worker).read_bytes()
    (run / worker).write_bytes(data[: len(data) // 2])  # a run killed mid-write
    (run / frontend).unlink()
    outside = tmp_path / "secret.json"
    outside.write_text('{"traceEvents": [{"ph": "X", "name": "secret", "ts": 1, "dur": 1}]}')
    trainer = next(
        f.path for w in manifest.windows if w.step == 1 and w.kind == "role" for f in w.files
    )
    (run / trainer).unlink()
    (run / trainer).symlink_to(outside)
    # replica_1's window failed, as the profiler records a server that died mid-window: what
    # could still be found of its traces is listed and is merged.
    step_file = run / "manifest" / "step_1.json"
    record = json.loads(step_file.read_text())
    for window in record["windows"]:
        if window["target"] == "replica_1":
            window.update(state="failed", stop_reason="error", error="the server died")
    step_file.write_text(json.dumps(record))

    (step,) = merge(run, steps=[1])
    notes = "\n".join(step.notes)
    # Cut mid-write: the events before the cut are merged, and the note says where it ended.
    cut = re.escape(worker) + r": cut short after \d+ events \(truncated .*\): what came before"
    assert re.search(cut, notes), notes
    assert worker in step.inputs
    assert f"{frontend}: not merged: missing" in notes
    assert f"{trainer}: not merged: a link: not followed below save_path" in notes
    events, doc = events_of(step.path)
    assert doc["aprof"]["notes"] == list(step.notes)
    labels = set(processes(events).values())
    assert "replica_0 · frontend" in labels
    assert any(label.startswith("replica_0 · vLLM worker") for label in labels)
    assert any(label.startswith("replica_1 · vLLM worker · python") for label in labels)
    assert not any(label.startswith("trainer · rank 0 · ") for label in labels)  # the capture's
    assert "trainer · rank 0" in labels  # the rank's timeline
    assert not any(e.get("name") == "secret" for e in events)


def test_the_command_line(demo: Path, tmp_path: Path) -> None:
    def aprof_merge(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "aprof", "merge", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    done = aprof_merge(str(demo), "--steps", "2", "--out", str(tmp_path), "--jobs", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"step 2: {tmp_path / 'step_2.trace.json.gz'} (")
    assert (tmp_path / "step_2.trace.json.gz").is_file()
    assert not (tmp_path / "step_1.trace.json.gz").exists()

    default = aprof_merge(str(demo), "--steps", "1")
    assert default.returncode == 0 and (demo / "merged" / "step_1.trace.json.gz").is_file()

    for args, line in [
        ((str(demo), "--steps", "3"), "no step of 3 was profiled in this run (profiled: 1, 2)"),
        ((str(tmp_path / "none"),), "cannot read"),
        ((str(demo), "--steps", "x"), "--steps"),
        ((str(demo), "--jobs", "0"), "jobs must be 1 or more, got 0"),
    ]:
        bad = aprof_merge(*args)
        assert bad.returncode == 1 and bad.stdout == ""
        assert bad.stderr.startswith("aprof merge: ") and line in bad.stderr
        assert bad.stderr.count("\n") == 1


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
EVENT_KEYS = st.sampled_from(["ph", "name", "pid", "tid", "ts", "dur", "id", "id2", "args", "cat"])


@settings(
    max_examples=40,
    deadline=None,
    # too_slow too: a slow machine's timing is no failure (tests/conftest.py's profiles)
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    events=st.lists(
        st.dictionaries(EVENT_KEYS, JSON_VALUES, max_size=6) | JSON_VALUES, max_size=12
    ),
    base=st.none() | st.integers() | st.floats() | st.text(max_size=4),
)
# Inputs that give the merged trace nothing: the first was once left out without a word.
@example(events=[{"ph": None, "ts": []}], base=0)
@example(events=[], base=0)
@example(events=[{"ph": "M", "name": "process_name", "pid": 1}], base=0)
@example(events=[{"pid": 7, "ts": float("nan")}, {"pid": 7, "ts": 10**400}], base=0)
def test_any_json_in_an_input_leaves_a_valid_merged_trace(
    demo: Path, tmp_path: Path, events: list[Any], base: Any
) -> None:
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(demo, run)
    manifest = aprof.load_manifest(run)
    frontend = next(
        f.path for w in manifest.windows if w.step == 2 for f in w.files if "async_llm" in f.path
    )
    doc = (
        {"traceEvents": events}
        if base is None
        else {"traceEvents": events, "baseTimeNanoseconds": base}
    )
    with gzip.open(run / frontend, "wt") as f:
        json.dump(doc, f)  # NaN and Infinity too: Python's json writes them

    (step,) = merge(run, steps=[2], out=tmp_path / "out", jobs=1)
    merged, _ = events_of(step.path)  # valid JSON, no NaN: whatever the input held
    assert len(merged) == step.events
    names = set(processes(merged).values())
    assert "driver" in names and any(n.startswith("replica_1 · vLLM worker") for n in names)
    # Every input is either merged or named in a note that says why, never both, never neither.
    named = [n for n in step.notes if n.startswith(f"{frontend}: not merged: ")]
    assert (frontend in step.inputs) != bool(named), (step.inputs, step.notes)
    assert all(len(n) > len(f"{frontend}: not merged: ") for n in named)


def test_worker_processes_merge_the_same_file_and_leave_nothing_behind(
    demo: Path, tmp_path: Path
) -> None:
    """``jobs=2`` (this process and a worker process, which takes captures from the back and
    whose parts are laid into the gzip stream as they are) and ``jobs=1`` give the same merged
    text, byte for byte, whoever placed which capture, and leave nothing but the merged files
    (``test_parallel.py`` holds a worker to each share, one of them failing;
    ``tests/faults/test_merge_and_export.py`` kills workers and merges)."""
    alone = merge(demo, out=tmp_path / "one", jobs=1)
    out = tmp_path / "two"
    together = merge(demo, out=out, jobs=2)
    for one, two in zip(alone, together, strict=True):
        assert gzip.decompress(one.path.read_bytes()) == gzip.decompress(two.path.read_bytes())
        assert (one.events, one.inputs, one.notes) == (two.events, two.inputs, two.notes)
    made = [p.path.name for p in together] + [p.archive.name for p in together if p.archive]
    left = sorted(p.name for p in out.iterdir())
    assert left == sorted(made)  # no part file of a worker's, no folder of the merge's
    with pytest.raises(ValueError, match="jobs must be 1 or more"):
        merge(demo, jobs=0)


def test_sglangs_ranks_are_named_as_sglang_names_them_and_its_merged_copy_is_skipped(
    demo: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(demo, run)
    manifest = aprof.load_manifest(run)
    (window,) = [w for w in manifest.windows if w.step == 1 and w.target == "replica_1"]
    worker = next(
        f.path for f in window.files if "async_llm" not in f.path and "pt.trace" in f.path
    )
    folder = (run / worker).parent
    ranks = folder / "1796.5-TP-1-DP-2-PP-0-EP-3-DECODE.trace.json.gz"
    copy = folder / "merged-1796.5.trace.json.gz"
    shutil.copy(run / worker, ranks)
    shutil.copy(run / worker, copy)
    step_file = run / "manifest" / "step_1.json"
    record = json.loads(step_file.read_text())
    for entry in record["windows"]:
        if entry["target"] == "replica_1":
            for path in (ranks, copy):
                entry["files"].append({"path": str(path.relative_to(run)), "bytes": 1})
    step_file.write_text(json.dumps(record))
    (step,) = merge(run, steps=[1], out=tmp_path / "out", jobs=1)
    assert str(ranks.relative_to(run)) in step.inputs
    assert str(copy.relative_to(run)) not in step.inputs + step.others
    events, _ = events_of(step.path)
    labels = set(processes(events).values())
    assert any(n.startswith("replica_1 · SGLang TP 1 DP 2 PP 0 EP 3 DECODE") for n in labels)


def test_a_timeline_in_parts_is_one_process_whose_spans_cross_parts(
    demo: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(demo, run)
    listing = json.loads((run / "manifest.json").read_text())
    (entry,) = [e for e in listing["timeline"] if e["process"].startswith("driver-")]
    first = run / entry["path"]
    with gzip.open(first, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    half = len(events) // 2  # a span begun in part 1 may end in part 2, as when a part fills
    second = first.with_name(first.name.replace(".trace.json.gz", ".2.trace.json.gz"))
    for path, part in ((first, events[:half]), (second, events[:1] + events[half:])):
        with gzip.open(path, "wt") as f:
            json.dump({**doc, "traceEvents": part}, f)
    listing["timeline"].append({**entry, "path": str(second.relative_to(run))})
    (run / "manifest.json").write_text(json.dumps(listing))

    for step in merge(run, out=tmp_path / "out"):
        merged, _ = events_of(step.path)
        names = processes(merged)
        assert list(names.values()).count("driver") == 1
        phases = Counter(e["ph"] for e in merged if names.get(e.get("pid")) == "driver")
        assert phases["b"] == phases["e"] > 0


def test_the_perfetto_archive_pins_each_file_where_the_merged_trace_puts_it(
    demo: Path, tmp_path: Path
) -> None:
    (step,) = merge(demo, steps=[1], out=tmp_path)
    assert step.archive == tmp_path / "step_1.perfetto.tar"
    with tarfile.open(step.archive) as tar:
        members = tar.getnames()
        document = json.load(tar.extractfile("perfetto_manifest.json"))
        files = {name: tar.extractfile(name).read() for name in members[1:]}
    assert members[0] == "perfetto_manifest.json"
    # The format's rules (version 1 of Perfetto's trace-manifest reference).
    body = document["perfetto_manifest"]
    assert body["version"] == 1
    entries = body["files"]
    paths = [entry["path"] for entry in entries]
    assert paths == list(step.inputs) == members[1:]  # every input, by its archive path
    assert all(files[p] == (demo / p).read_bytes() for p in paths)  # untouched
    reference, *pinned = entries
    assert "clocks" not in reference and reference["path"].startswith("timeline/driver")
    for entry in pinned:
        clocks = entry["clocks"]
        assert set(clocks) == {"sync_to", "offset_ns"}
        assert clocks["sync_to"] == {"file": reference["path"]}  # pinned: no clock named
        assert isinstance(clocks["offset_ns"], int) and not isinstance(clocks["offset_ns"], bool)
    assert body["attributes"] == {"aprof.run_id": aprof.load_manifest(demo).run_id, "aprof.step": 1}

    # Each pinned file lands where the merged trace puts it (a slice of each, by wall clock).
    merged, doc = events_of(step.path)
    driver_base = json.loads(gzip.decompress(files[reference["path"]]))["baseTimeNanoseconds"]
    for entry in pinned:
        own = json.loads(gzip.decompress(files[entry["path"]]))
        # A capture's first complete slice, or a timeline's first span of the step.
        first = next(
            e
            for e in own["traceEvents"]
            if e.get("ph") == "X" or (e.get("ph") == "b" and e["args"].get("step") == 1)
        )
        wall = driver_base + entry["clocks"]["offset_ns"] + round(first["ts"] * 1000)
        same = [
            doc["baseTimeNanoseconds"] + round(e["ts"] * 1000)
            for e in merged
            if e.get("ph") == first["ph"]
            and e.get("name") == first["name"]
            and e.get("dur") == first.get("dur")
        ]
        assert any(abs(w - wall) <= 1000 for w in same), entry["path"]


def test_files_from_other_hosts_name_their_machine() -> None:
    from aprof._merge.archive import ArchiveFile, manifest

    files = [
        ArchiveFile("timeline/driver-1.trace.json.gz", Path("a"), 5_000, "head"),
        ArchiveFile("timeline/agent_loop_worker_0.trace.json.gz", Path("b"), 7_000, "node-2"),
        ArchiveFile("step_1/rollout/replica_0/w.pt.trace.json.gz", Path("c"), 1_000),
    ]
    entries = manifest(files, attributes={})["perfetto_manifest"]["files"]
    assert [e.get("machine") for e in entries] == [{"name": "head"}, {"name": "node-2"}, None]
    assert [e.get("clocks", {}).get("offset_ns") for e in entries] == [None, 2_000, -4_000]
    one_host = manifest(files[:1] + files[2:], attributes={})["perfetto_manifest"]["files"]
    assert all("machine" not in e for e in one_host)


def link_events(events: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") == "aprof.link" and e["ph"] == phase]


def requests_named(events: list[dict[str, Any]], step: dict[str, Any]) -> list[str]:
    """The request ids the ``requests:`` records inside forward step ``step`` name."""
    from aprof._merge.flows import request_ids

    return [
        request_id
        for e in events
        if e.get("ph") == "X"
        and str(e.get("name")).startswith("requests: ")
        and (e["pid"], e["tid"]) == (step["pid"], step["tid"])
        and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]
        for request_id in request_ids(e["name"])
    ]


def test_flow_arrows_land_on_forward_steps_that_list_the_request(
    demo: Path, tmp_path: Path
) -> None:
    for merged in merge(demo, out=tmp_path):
        events, _ = events_of(merged.path)
        names = processes(events)
        spans: dict[tuple[int, str], tuple[int, float, float]] = {}  # (pid, id) -> replica, span
        begun: dict[str, dict[str, Any]] = {}
        for e in events:
            if e.get("cat") == "request" and e["ph"] == "b":
                begun[e["id2"]["local"]] = e
            elif e.get("cat") == "request" and e["ph"] == "e":
                b = begun.pop(e["id2"]["local"])
                spans[(b["pid"], b["args"]["request_id"])] = (
                    b["args"]["replica"],
                    b["ts"],
                    e["ts"],
                )
        lanes = {(e["pid"], e["tid"], e["ts"]): e for e in link_events(events, "X")}
        thread_starts = Counter((e["pid"], e["tid"], e["ts"]) for e in events if e.get("ph") == "X")
        forward = {
            (e["pid"], e["tid"], e["ts"]): e
            for e in events
            if e.get("ph") == "X" and str(e.get("name")).startswith("forward_step#")
        }
        starts = {e["id"]: e for e in link_events(events, "s")}
        ends = {e["id"]: e for e in link_events(events, "f")}
        assert starts and set(starts) == set(ends)  # each arrow has its two ends
        assert len(set(starts)) == len(link_events(events, "s"))  # ids unique
        other_flows = {
            e["id"] for e in events if e.get("ph") in "stf" and e.get("cat") != "aprof.link"
        }
        assert not other_flows & set(starts)
        arrows: Counter[tuple[int, str]] = Counter()
        for number, start in starts.items():
            # Its start: the only slice of its lane there, a copy of one request span.
            where = (start["pid"], start["tid"], start["ts"])
            lane = lanes[where]
            assert thread_starts[where] == 1
            request_id, replica = lane["args"]["request_id"], lane["args"]["replica"]
            assert names[start["pid"]] == "driver"
            span_replica, begin, end = spans[(start["pid"], request_id)]
            assert (span_replica, begin) == (replica, lane["ts"])
            assert lane["ts"] + lane["dur"] == pytest.approx(end, abs=0.01)
            # Its end: the begin of a forward step of that replica's worker, the innermost
            # slice there, whose record names the request.
            end_event = ends[number]
            assert end_event["bp"] == "e"
            at = (end_event["pid"], end_event["tid"], end_event["ts"])
            step = forward[at]
            assert thread_starts[at] == 1
            assert names[end_event["pid"]].startswith(f"replica_{replica} · vLLM worker")
            assert request_id in requests_named(events, step)
            arrows[(replica, request_id)] += 1
        # Every request the captured forward steps served gets an arrow per forward step.
        served: Counter[tuple[int, str]] = Counter()
        for step in forward.values():
            replica = int(names[step["pid"]].split(" ")[0].removeprefix("replica_"))
            named = set(requests_named(events, step))
            assert named  # each captured forward step served requests of this step
            for request_id in named:
                served[(replica, request_id)] += 1
        assert arrows == served
        assert {r for r, _ in served} == {0, 1}
        assert not [n for n in merged.notes if n.startswith("links")]


def test_traces_that_name_no_requests_get_no_arrows(demo: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(demo, run)
    manifest = aprof.load_manifest(run)
    for path in (f.path for w in manifest.windows if w.kind == "rollout" for f in w.files):
        if path.endswith(".json.gz"):  # as real vLLM writes it: no requests: records
            with gzip.open(run / path, "rt") as f:
                doc = json.load(f)
            doc["traceEvents"] = [
                e for e in doc["traceEvents"] if not str(e.get("name")).startswith("requests: ")
            ]
            with gzip.open(run / path, "wt") as f:
                json.dump(doc, f)
    (step,) = merge(run, steps=[1], out=tmp_path / "out")
    events, _ = events_of(step.path)
    assert not [e for e in events if e.get("cat") == "aprof.link"]
    assert step.notes == ()


def test_arrows_beyond_the_bound_are_left_out_with_a_note(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aprof._merge.flows

    monkeypatch.setattr(aprof._merge.flows, "MAX_FLOWS", 5)
    (step,) = merge(demo, steps=[1], out=tmp_path)
    events, doc = events_of(step.path)
    assert len(link_events(events, "s")) == len(link_events(events, "f")) == 5
    (note,) = step.notes
    assert note.startswith("links: ") and note.endswith(
        "arrows from requests to forward steps found, the first 5 drawn"
    )
    assert doc["aprof"]["notes"] == [note]


def test_files_of_another_host_move_by_its_measured_clock_offset(
    demo: Path, tmp_path: Path
) -> None:
    """The run as if replica 0's server had written its traces on a host whose wall clock
    reads 2.5 s behind the driver's: merged, its events move by the offset the manifest
    measured; the rest, and a merge that trusts the wall clocks, do not."""
    run = tmp_path / "run"
    shutil.copytree(demo, run, ignore=shutil.ignore_patterns("merged"))
    manifest = aprof.load_manifest(run)
    moved = {f.path for w in manifest.windows if w.target == "replica_0" for f in w.files}
    assert moved
    run_file = json.loads((run / "manifest.json").read_text())
    offset_ns = 2_500_000_000
    run_file["hosts"] = [
        {"host": "head", "offset_ns": 0, "uncertainty_ns": 0, "measured_ns": 1},
        {"host": "node-b", "offset_ns": offset_ns, "uncertainty_ns": 40_000, "measured_ns": 1},
    ]
    run_file["files"] = [{"path": p, "host": "node-b", "bytes": 1} for p in sorted(moved)]
    (run / "manifest.json").write_text(json.dumps(run_file))

    def slices(out: Path) -> tuple[dict[str, list[float]], dict[str, int]]:
        (step,) = merge(run, steps=[1], out=out, jobs=1, clock_offsets=out.name == "fixed")
        events, doc = events_of(step.path)
        names = processes(events)
        by_process: dict[str, list[float]] = {}
        for e in events:
            if e.get("ph") == "X":
                wall_us = doc["baseTimeNanoseconds"] / 1000 + e["ts"]
                by_process.setdefault(names[e["pid"]], []).append(wall_us)
        with tarfile.open(step.archive) as tar:
            body = json.load(tar.extractfile("perfetto_manifest.json"))["perfetto_manifest"]
        offsets = {f["path"]: f.get("clocks", {}).get("offset_ns", 0) for f in body["files"]}
        return by_process, offsets

    fixed, fixed_offsets = slices(tmp_path / "fixed")
    trusted, trusted_offsets = slices(tmp_path / "trusted")
    assert set(fixed) == set(trusted)
    for process, walls in fixed.items():
        shift = offset_ns / 1000 if process.startswith("replica_0") else 0
        assert walls == pytest.approx([w + shift for w in trusted[process]], abs=1), process
    assert any(p.startswith("replica_0") for p in fixed)
    for path, offset in fixed_offsets.items():
        assert offset - trusted_offsets[path] == (offset_ns if path in moved else 0), path
