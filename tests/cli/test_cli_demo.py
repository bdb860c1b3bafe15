"""``aprof demo`` and the examples, run as real subprocesses."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._report import collect
from aprof.testing import assert_windows
from servers.process import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def assert_quiet(
    done: subprocess.CompletedProcess[str], out: Path, *, launched: bool = True
) -> None:
    """The terminal shows aprof's lines only: torch's own lines (the trainer process's
    output) go to the trainer's log file, which the demo names at the end, with the logs of
    the servers it ``launched``."""
    for noise in ("USDT:", "ERROR:", "UserWarning", "Traceback"):
        assert noise not in done.stdout and noise not in done.stderr, noise
    servers = "replica_<r>.log: the servers; " if launched else ""
    assert f"logs: {out / 'logs'} ({servers}trainer.log: " in done.stdout
    assert (out / "logs" / "trainer.log").is_file()


@contextlib.contextmanager
def reference_server(dialect: str, tmp_path: Path) -> Iterator[str]:
    """A reference server speaking ``dialect`` on 127.0.0.1, as a subprocess; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / f"reference-{dialect}.log"
    with log.open("w") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "aprof", "serve-reference", "--port", str(port),
             "--dialect", dialect, "--profiler-dir", str(tmp_path / "server_traces")],
            cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"the server exited:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, f"the server never got healthy:\n{log.read_text()}"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def _trace_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def test_demo_profiles_the_selected_steps(tmp_path: Path) -> None:
    """The demo launches reference servers, rolls out tool loops, trains, and leaves a manifest
    with the rollout windows (every replica but the last) and trainer windows of the selected
    steps, their traces and a timeline."""
    out = tmp_path / "demo"
    done = run(
        "-m", "aprof", "demo", "--num-steps", "3", "--steps", "1,3", "--replicas", "2",
        "--concurrency", "4", "--forward-steps", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "step 3/3: 4 rollouts (0 failed" in done.stderr
    assert "replica_0" in done.stdout and "timeline:" in done.stdout
    assert "profiling steps 1,3 of 3 (replica_1 not captured: the report sets its" in done.stderr
    assert_quiet(done, out)
    assert_windows(
        out,
        [
            {"step": s, "target": "replica_0", "state": "done", "stop_reason": "auto_stop"}
            for s in (1, 3)
        ]
        + [{"step": s, "target": "trainer", "kind": "role", "state": "done"} for s in (1, 3)],
    )
    manifest = aprof.load_manifest(out)
    for w in manifest.windows:
        assert w.files, w
        for f in w.files:
            assert (out / f.path).exists()
        if w.kind == "rollout":
            assert w.forward_steps.observed == 2
            assert f"step_{w.step}/rollout/replica_" in w.files[0].path
        else:
            # The trainer's capture holds the policy update and its mini-batches.
            (trace,) = [f for f in w.files if f.path.endswith(".pt.trace.json.gz")]
            names = {e.get("name") for e in _trace_events(out / trace.path)}
            assert {"update_policy", "mini_batch0"} <= names
    # The driver's timeline holds one request span per request the agent loops made; the
    # trainer's own, its update in each of the three steps.
    driver, trainer = sorted(manifest.timeline, key=lambda f: f.process)
    assert driver.process.startswith("driver-")
    assert trainer.process.startswith("trainer-rank0-")
    stages = [e for e in _trace_events(out / trainer.path) if e.get("ph") == "b" and "args" in e]
    assert [(e["name"], e["args"]["aprof"]) for e in stages] == [("update_policy", "stage")] * 3
    events = _trace_events(out / driver.path)
    requests = [e for e in events if e.get("ph") == "b" and e.get("cat") == "request"]
    turns = [e for e in events if e.get("ph") == "b" and e.get("name") == "turn"]
    assert len(requests) == len(turns) == 3 * 4 * 3  # steps x loops x turns
    assert {e["args"]["step"] for e in requests} == {1, 2, 3}
    # A profiled step's first requests to replica_0 went ahead while it captured; once the
    # server had stopped the capture after its forward steps, the window ended and the later
    # ones were not captured; replica_1, never captured, served the others.
    for step in (1, 2, 3):
        marks = [
            (e["args"]["replica"], e["args"]["captured"])
            for e in requests
            if e["args"]["step"] == step
        ]
        if step == 2:
            assert not any(captured for _, captured in marks), marks
        else:
            assert any(captured for _, captured in marks), marks
            assert all(replica == 0 for replica, captured in marks if captured), marks
            assert not all(captured for replica, captured in marks if replica == 0), marks
    # It ends with each profiled step merged onto one clock (aprof merge).
    for step in (1, 3):
        merged = out / "merged" / f"step_{step}.trace.json.gz"
        assert f"merged: {merged} (step {step})" in done.stdout.splitlines()
        events = _trace_events(merged)
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        # Processes named by role and rank: the trainer's timeline as its captures are.
        assert {"driver", "replica_0 · frontend", "trainer · rank 0"} <= set(names.values())
        assert not any(name.startswith("trainer-") for name in names.values())
        # Every process holds events of its own, more than one: Kineto's one-event tracks
        # (its profiler's span, the iteration's start, the record window's end) are folded
        # into the trace's host process.
        held = Counter(e["pid"] for e in events if e.get("ph") != "M")
        assert all(held[pid] > 1 for pid in names), (names, held)
        assert any(e.get("name") == "Record Window End" for e in events)
    # ... and with the report (aprof report): a line per step with its captured and
    # uncaptured requests, and where its HTML is.
    lines = done.stdout.splitlines()
    kinds = re.compile(
        r"  step [13]: latency p50 captured [^(]+\((\d+)\), uncaptured [^(]+\((\d+)\);"
    )
    counts = [(int(m[1]), int(m[2])) for m in map(kinds.match, lines) if m]
    assert len(counts) == 2 and all(c > 0 and u > 0 and c + u == 12 for c, u in counts), counts
    report = out / "report.html"
    assert f"report: {report} (all of it in the terminal: aprof report {out} --no-html)" in lines
    assert report.is_file()


def test_demo_fully_async(tmp_path: Path) -> None:
    """In fully-async mode rollouts run across step boundaries and the windows still land;
    every step is accounted, its training overlapping its rollouts, staleness counted."""
    out = tmp_path / "demo"
    done = run(
        "-m", "aprof", "demo", "--mode", "fully-async", "--num-steps", "2", "--steps", "2",
        "--replicas", "1", "--concurrency", "4", "--forward-steps", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert_quiet(done, out)
    assert_windows(
        out,
        [
            {"step": 2, "target": "replica_0", "state": "done"},
            {"step": 2, "target": "trainer", "state": "done"},
        ],
    )
    accounts = collect(out).accounts
    assert [(a.step, a.profiled) for a in accounts] == [(1, False), (2, True)]
    for a in accounts:
        assert a.train_s > 0, a  # the update_policy stage of every step
        # By construction: the trainer takes a full buffer (one trajectory per worker), so
        # the worker whose rollout completed the batch, or one the take woke, begins its next
        # request before the event loop sees the policy update's answer (asyncio runs its
        # callbacks in order): that request is in flight while the stage runs.
        assert a.overlap_s > 0, a
        assert a.rollout_s + a.train_s - a.overlap_s + a.idle_s == pytest.approx(a.wall_s, abs=1e-3)
    # The demo's stream has max_staleness=1. Step 1 takes rollouts begun in step 1; step 2
    # the oldest finished first, begun in step 1 (a worker begins no rollout before its
    # step-1 one finished).
    staleness = [a.staleness for a in accounts]
    assert staleness[0] is not None and staleness[0]["max"] == 0
    assert staleness[1] is not None and staleness[1]["max"] == 1


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_demo_profiles_running_servers(tmp_path: Path, kind: str) -> None:
    """``--server vllm|sglang URL``: the demo profiles a server it did not launch (here the
    reference server in that dialect), through the adapter of that engine."""
    out = tmp_path / "demo"
    with reference_server(kind, tmp_path) as url:
        done = run(
            "-m", "aprof", "demo", "--server", kind, url, "--num-steps", "3", "--steps", "1,3",
            "--concurrency", "4", "--forward-steps", "2", "--out", str(out),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "launching" not in done.stderr
    assert "step 3/3: 4 rollouts (0 failed" in done.stderr
    assert_quiet(done, out, launched=False)
    window = {"target": "replica_0", "state": "done", "stop_reason": "auto_stop"}
    assert_windows(
        out,
        [{**window, "step": s, "forward_steps.observed": 2} for s in (1, 3)]
        + [{"step": s, "target": "trainer", "state": "done"} for s in (1, 3)],
    )
    rollouts = [w for w in aprof.load_manifest(out).windows if w.kind == "rollout"]
    if kind == "sglang":
        # The window's folder was each capture's output_dir: SGLang's own file names there.
        for w in rollouts:
            assert [Path(f.path).name[-19:] for f in w.files] == ["-TP-0.trace.json.gz"], w
    else:
        # vLLM writes into its launch-time directory, which a URL does not tell: the traces
        # stay there.
        assert all(not w.files for w in rollouts)
        assert len(list((tmp_path / "server_traces").rglob("*.pt.trace.json.gz"))) >= 2


def test_demo_launches_reference_servers_in_the_sglang_dialect(tmp_path: Path) -> None:
    """``--server reference sglang``: the launched servers speak SGLang's profiling routes."""
    out = tmp_path / "demo"
    done = run(
        "-m", "aprof", "demo", "--server", "reference", "sglang", "--num-steps", "2",
        "--steps", "2", "--replicas", "1", "--concurrency", "2", "--forward-steps", "2",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "launching 1 reference servers (SGLang dialect)" in done.stderr
    assert_quiet(done, out)
    assert_windows(
        out,
        [
            {"step": 2, "target": "replica_0", "state": "done", "stop_reason": "auto_stop"},
            {"step": 2, "target": "trainer", "state": "done"},
        ],
    )
    (rollout,) = [w for w in aprof.load_manifest(out).windows if w.kind == "rollout"]
    assert [Path(f.path).name[-19:] for f in rollout.files] == ["-TP-0.trace.json.gz"]
    # The report reads the SGLang-dialect traces' iterations.
    (step,) = aprof.report(out, html=False).steps
    assert step.iterations["replica_0"].count == rollout.forward_steps.observed == 2


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue  # the process ended while we looked
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the servers")
def test_demo_stops_its_servers_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C in the middle of a profiled step stops the servers the demo launched."""
    out = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "aprof", "demo", "--num-steps", "50", "--steps", "2",
         "--replicas", "2", "--concurrency", "2", "--out", str(out)],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        # A suite started in the background (`... &` from a script) runs with SIGINT ignored,
        # and children inherit that: the demo would then never see the Ctrl-C sent below.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert demo.stderr is not None
        seen = []
        for line in itertools.islice(demo.stderr, 200):  # bounded: the run prints ~60 lines
            seen.append(line)
            if line.startswith("step 1/50"):
                break  # step 2, profiled, is under way
        else:
            raise AssertionError("the demo never finished step 1:\n" + "".join(seen))
        # The servers write into the run's folder: that names them among all processes.
        assert _processes_mentioning(str(out / "server_traces")), "no server was running"
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 130
        assert _processes_mentioning(str(out / "server_traces")) == []
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(timeout=30)
    # The interrupted run still leaves a valid manifest.
    aprof.load_manifest(out)


def test_demo_bad_input_is_one_line(tmp_path: Path) -> None:
    """A bad option value exits 1 with one line and no traceback."""
    done = run("-m", "aprof", "demo", "--steps", "0,1", "--out", str(tmp_path / "x"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("aprof demo: global_profiler.steps")


@pytest.mark.parametrize(
    ("server", "line"),
    [
        (["tgi", "http://h:1"], "--server: expected 'reference [vllm|sglang]', 'vllm URL [URL"),
        (["sglang"], "--server sglang needs the URL of at least one running SGLang server"),
        (["vllm"], "--server vllm needs the URL of at least one running vLLM server"),
        (["sglang", "h:1"], "--server sglang: not an http(s) URL: 'h:1'"),
        (["reference", "http://h:1"], "--server reference: expected the dialect 'vllm' or"),
        (["sglang", "http://127.0.0.1:1"], "cannot read the served model from http://127.0.0.1:1"),
        # The URL's user and password are never shown.
        (["vllm", "http://u:secret@127.0.0.1:1"], "cannot read the served model from http://127"),
    ],
)
def test_demo_bad_server_is_one_line(tmp_path: Path, server: list[str], line: str) -> None:
    """A bad ``--server`` exits 1 with one line that says what was wrong."""
    done = run("-m", "aprof", "demo", "--server", *server, "--out", str(tmp_path / "x"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"aprof demo: {line}"), done.stderr
    assert "secret" not in done.stderr + done.stdout


def test_custom_target_example(tmp_path: Path) -> None:
    """The custom-target example writes one heap report per profiled step."""
    done = run(str(ROOT / "examples" / "custom_target.py"), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    manifest = aprof.load_manifest(tmp_path / "out")
    assert [(w.step, w.state) for w in manifest.windows] == [(2, "done"), (3, "done")]
    report = tmp_path / "out" / manifest.windows[0].files[0].path
    assert "size=" in report.read_text()


def test_example_config_validates() -> None:
    """The example config of the README loads."""
    config = aprof.load_config(ROOT / "examples" / "profile.yaml")
    assert 5 in config.global_profiler.steps and config.rollout.forward_steps == 8


def test_demo_without_torch_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without torch the demo stops before launching anything, with the install line."""
    import importlib.util

    from aprof.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert main(["demo", "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install torch==2.13.0" in err
    assert not (tmp_path / "x").exists()
