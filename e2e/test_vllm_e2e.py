"""aprof against a real vLLM (the CPU build, 0.32.0) serving a tiny Llama on this machine.

Launched through ``launch_spec`` + ``launch``; profiled through the ``VLLMServer`` adapter
(HTTP) and the in-process ``VLLMEngine`` adapter. Each worker trace is opened and its engine
iterations counted: the window bounds are checked in what the capture holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

import aprof
from aprof.testing import assert_windows
from servers.launch import LaunchSpec, launch_spec
from servers.process import free_port, launch
from servers.trace_files import count_vllm_iterations, is_vllm_worker_trace

VERSION = "0.32.0"
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "256"]
HEALTH_TIMEOUT_S = 240
CONCURRENT = 4
MAX_TOKENS = 16  # with ignore_eos: 1 prefill + 15 decode steps per request, well over 4 + 1


def _config(save_path: Path, steps: list[int], **sections: Any) -> aprof.ProfilerConfig:
    return aprof.load_config(
        {
            **sections,
            # Steps here last a fraction of a second, shorter than a stop (which moves and
            # counts the traces): without waiting, the next window may still be queued behind
            # the previous stop when its step ends, and is skipped by design.
            "global_profiler": {
                "steps": steps,
                "save_path": str(save_path),
                "wait_for_stops": True,
            },
            "rollout": {"forward_steps": 4},
            "tool_config": {"torch": {"contents": ["cpu"]}},
            "timeouts": {"connect_s": 10, "start_s": 60, "stop_s": 300},
        }
    )


def _spec(
    cfg: aprof.ProfilerConfig, model: Path, env: dict[str, str], *, profiling: bool
) -> LaunchSpec:
    spec = launch_spec(
        "vllm",
        cfg,
        version=VERSION,
        profiling=profiling,
        model=str(model),
        port=free_port(),
        server_args=SERVER_ARGS,
    )
    return dataclasses.replace(spec, env={**spec.env, **env})


async def _run_steps(
    prof: aprof.Profiler, base_url: str, model: Path, num_steps: int
) -> list[dict[str, Any]]:
    """``num_steps`` steps of concurrent completions, each inside ``prof.request``."""
    answers: list[dict[str, Any]] = []

    async def complete(http: aiohttp.ClientSession, step: int, i: int) -> None:
        body = {
            "model": str(model),
            "prompt": f"hello world {step} {i}",
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        url = f"{base_url}/v1/completions"
        async with prof.request(replica=0, request_id=f"s{step}-r{i}") as req:
            assert req.traceparent is not None and req.tracestate is not None
            headers = {"traceparent": req.traceparent, "tracestate": req.tracestate}
            async with http.post(url, json=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                answers.append(await response.json())

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for step in range(1, num_steps + 1):
            async with prof.step(step):
                await asyncio.gather(*(complete(http, step, i) for i in range(CONCURRENT)))
    return answers


def _worker_traces(save_path: Path, files: list[str]) -> list[Path]:
    return [save_path / f for f in files if is_vllm_worker_trace(Path(f))]


async def test_profiled_steps_capture_exactly_the_window(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """Steps [1, 2, 5] of 6: one window each, traces in the step folders, 4 iterations each;
    vLLM's own request spans (``otel`` on, launched through ``launch_spec``) received by
    aprof, each filed under its step as the child of its aprof request."""
    save_path = tmp_path / "profile"
    cfg = _config(save_path, [1, 2, 5], otel={"receive": True, "port": free_port()})
    spec = _spec(cfg, tiny_model, owned_env, profiling=True)
    log = tmp_path / "vllm.log"
    server = await launch(spec, log_path=log, health_timeout_s=HEALTH_TIMEOUT_S)
    async with server, aprof.Profiler(cfg) as prof:
        prof.add_target(server.adapter(replica=0))
        answers = await _run_steps(prof, server.base_url, tiny_model, 6)
        await _spans_arrive(prof, 6 * CONCURRENT)
    assert len(answers) == 6 * CONCURRENT
    _assert_vllms_spans(save_path, 6)
    _assert_reported_server_side(save_path)
    window = {
        "target": "replica_0",
        "state": "done",
        "forward_steps.requested": 4,
        "forward_steps.enforced_by": "server",
    }
    assert_windows(prof.manifest, [{**window, "step": n} for n in (1, 2, 5)])
    for record in prof.manifest.windows:
        files = [f.path for f in record.files]
        assert files, f"step {record.step}: no files"
        assert all(f.startswith(f"step_{record.step}/rollout/replica_0/") for f in files), files
        workers = _worker_traces(save_path, files)
        assert workers, f"step {record.step}: no worker trace among {files}"
        assert [count_vllm_iterations(w) for w in workers] == [4] * len(workers)
    assert spec.profiler_dir is not None
    left = [p.name for p in spec.profiler_dir.iterdir() if is_vllm_worker_trace(p)]
    assert left == [], "worker traces left behind in the server's trace folder"
    _assert_merged_on_the_window(save_path, prof.manifest.windows[0])


async def _spans_arrive(prof: aprof.Profiler, count: int) -> None:
    """Wait (at most 60 s) until the receiver has ``count`` spans: vLLM exports a request's
    span once it ends, in batches (every 500 ms, as ``launch_spec`` sets it)."""
    async with asyncio.timeout(60):
        # A condition polled, bounded: the spans come from another process, on its schedule.
        while prof.manifest.otel is None or prof.manifest.otel.spans < count:  # noqa: ASYNC110
            await asyncio.sleep(0.1)


def _assert_vllms_spans(save_path: Path, num_steps: int) -> None:
    """Each request's ``llm_request`` span in its step's file, the child of the request's
    own span (its trace context carried the client's trace id), with its phases' times."""
    from aprof._timeline.recorder import span_id_of

    for step in range(1, num_steps + 1):
        path = save_path / "otel" / f"step_{step}.spans.jsonl"
        spans = [json.loads(line) for line in path.read_text().splitlines()]
        by_parent = {s["parent_span_id"]: s for s in spans if s["name"] == "llm_request"}
        assert len(by_parent) == CONCURRENT, spans
        for i in range(CONCURRENT):
            span = by_parent[span_id_of(f"s{step}-r{i}")]
            attributes = span["attributes"]
            assert attributes["gen_ai.usage.completion_tokens"] == MAX_TOKENS
            for phase in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode"):
                assert attributes[f"gen_ai.latency.{phase}"] >= 0
            assert span["start_ns"] < span["end_ns"]


def _assert_reported_server_side(save_path: Path) -> None:
    """``aprof report --json``: each step's server side from vLLM's spans, and for its slowest
    requests the time outside the server (vLLM's ``e2e`` below the client's latency)."""
    from aprof._report import accounting
    from aprof._report.document import document

    steps = document(accounting(save_path))["steps"]
    assert [s["server"]["spans"] for s in steps] == [CONCURRENT] * len(steps)
    for step in steps:
        assert step["server"]["decode_s"]["max"] > 0
        # vLLM's span carries the request's tracestate back: its replica.
        assert [(r["replica"], r["spans"]) for r in step["server"]["replicas"]] == [(0, CONCURRENT)]
        for slow in step["server"]["slowest"]:
            assert slow["server"] is not None and slow["server"]["gap_s"] >= 0


def _assert_merged_on_the_window(save_path: Path, window: aprof.WindowRecord) -> None:
    """``aprof merge`` places vLLM's own worker (and frontend) traces of the window by their
    clocks: every slice of them lies within the window's start and stop (wall clock)."""
    (merged,) = aprof.merge(save_path, steps=[window.step])
    assert merged.notes == ()
    with gzip.open(merged.path, "rt") as f:
        doc = json.load(f)
    names = {
        e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"
    }
    assert any(n.startswith("replica_0 · vLLM worker") for n in names.values()), names
    # vLLM's own span of each request nested under it, with its phases.
    served = [e for e in doc["traceEvents"] if e.get("cat") == "aprof.server"]
    assert sum(e["name"] == "llm_request" for e in served) == CONCURRENT
    assert {"prefill", "decode"} <= {e["name"] for e in served}
    if any("async_llm" in f.path for f in window.files):
        assert "replica_0 · frontend" in names.values(), names
    assert window.started_ns is not None and window.stopped_ns is not None
    slack_ns = 2_000_000_000  # the capture's own start and stop take a moment
    base = doc["baseTimeNanoseconds"]
    slices = [
        base + e["ts"] * 1000
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and names.get(e.get("pid"), "").startswith("replica_0")
    ]
    assert slices
    assert (
        window.started_ns - slack_ns <= min(slices) and max(slices) <= window.stopped_ns + slack_ns
    )


async def test_server_without_profiling_gives_a_clear_failed_window(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """A vLLM launched without --profiler-config: the window fails and says how to launch it;
    the requests of the step are served all the same."""
    cfg = _config(tmp_path / "profile", [1])
    spec = _spec(cfg, tiny_model, owned_env, profiling=False)
    assert "--profiler-config.profiler=torch" not in " ".join(spec.command)
    log = tmp_path / "vllm.log"
    server = await launch(spec, log_path=log, health_timeout_s=HEALTH_TIMEOUT_S)
    async with server, aprof.Profiler(cfg) as prof:
        prof.add_target(server.adapter(replica=0))
        answers = await _run_steps(prof, server.base_url, tiny_model, 1)
    assert len(answers) == CONCURRENT
    assert_windows(prof.manifest, [{"step": 1, "target": "replica_0", "state": "failed"}])
    error = prof.manifest.windows[0].error or ""
    assert "404" in error, error
    assert "--profiler-config.profiler=torch" in error, error
    assert "--profiler-config.torch_profiler_dir=" in error, error


def test_inprocess_asyncllm_through_the_engine_adapter(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """An AsyncLLM of the script's own process, profiled on steps [1, 3] with 3 forward steps;
    called as verl calls it (its request id, no trace context), its request spans are filed
    under their steps by the request they name and reported."""
    script = Path(__file__).with_name("inprocess_vllm.py")
    out = tmp_path / "out"
    log = tmp_path / "inprocess.log"
    with log.open("wb") as output:
        # Its own session: engine processes it leaves behind are killed with the group.
        process = subprocess.Popen(
            [sys.executable, str(script), str(tiny_model), str(out)],
            env={**os.environ, **owned_env},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = process.wait(timeout=400)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    assert returncode == 0, log.read_text(errors="replace")[-4000:]
    save_path = out / "profile"
    window = {
        "target": "replica_0",
        "state": "done",
        "stop_reason": "auto_stop",
        "forward_steps.observed": 3,
        "forward_steps.enforced_by": "server",
    }
    assert_windows(save_path / "manifest.json", [{**window, "step": n} for n in (1, 3)])
    for record in aprof.load_manifest(save_path / "manifest.json").windows:
        files = [f.path for f in record.files]
        assert all(f.startswith(f"step_{record.step}/rollout/replica_0/") for f in files), files
        workers = _worker_traces(save_path, files)
        assert workers
        assert [count_vllm_iterations(w) for w in workers] == [3] * len(workers)
    _assert_spans_found_by_request_id(save_path)


def _assert_spans_found_by_request_id(save_path: Path) -> None:
    """vLLM's span of each request, sent without trace context (another trace), names the
    request (``gen_ai.request.id``): the receiver files it under the step the request was in,
    and the report finds each step's requests' server side by it."""
    from aprof._otel import otel_folder, read_step, served
    from aprof._report import accounting
    from aprof._report.document import document
    from aprof._timeline.recorder import span_id_of

    for step in (1, 2, 3):
        with otel_folder(save_path) as folder:
            assert folder is not None
            found = read_step(folder, step)
        assert found is not None, f"no spans filed for step {step}"
        requests, _ = served(found.spans)
        assert sorted(requests) == sorted(span_id_of(f"s{step}-r{i}") for i in range(3))
        for request in requests.values():
            assert request.name == "llm_request" and request.replica is None
            assert [p.name for p in request.phases] == ["queued", "prefill", "decode"]
    steps = document(accounting(save_path))["steps"]
    assert [s["server"]["spans"] for s in steps] == [3, 3, 3]
    for step in steps:
        assert all(slow["server"] is not None for slow in step["server"]["slowest"])


async def test_demo_against_real_vllm(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """``aprof demo --server vllm URL``: tool-calling agent loops through the OpenAI API of a
    real vLLM, its profiled step captured and auto-stopped by the server."""
    cfg = _config(tmp_path / "launch", [1])
    spec = launch_spec(
        "vllm",
        cfg,
        version=VERSION,
        model=str(tiny_model),
        port=free_port(),
        # The third turn's prompt holds two tool results: all the tiny model's 512 positions.
        server_args=["--dtype", "float32", "--max-model-len", "512"],
    )
    spec = dataclasses.replace(spec, env={**spec.env, **owned_env})
    server = await launch(spec, log_path=tmp_path / "vllm.log", health_timeout_s=HEALTH_TIMEOUT_S)
    out = tmp_path / "demo"
    async with server:
        demo = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aprof", "demo", "--server", "vllm", server.base_url,
            "--num-steps", "2", "--steps", "2", "--concurrency", "4", "--forward-steps", "4",
            "--out", str(out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(demo.communicate(), timeout=300)
    assert demo.returncode == 0, stderr.decode(errors="replace")[-4000:]
    assert "step 2/2: 4 rollouts (0 failed" in stderr.decode()
    assert_windows(
        out,
        [
            {"step": 2, "target": "replica_0", "state": "done", "forward_steps.observed": 4},
            {"step": 2, "target": "trainer", "state": "done"},
        ],
    )
    assert "replica_0" in stdout.decode()
