"""aprof against a real SGLang (0.5.23, the torch-native CPU path) serving a tiny Llama.

Launched through ``launch_spec`` + ``launch``; profiled first by hand (the environment works:
``/start_profile`` with ``num_steps`` writes a trace of that many forward passes), then through
the ``SGLangServer`` adapter and ``aprof.Profiler``, also with the server killed mid-window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import aprof
from aprof.testing import assert_windows
from servers.launch import LaunchSpec, launch_spec
from servers.process import LaunchedServer, free_port, launch
from servers.trace_files import count_sglang_steps

pytest.importorskip("sglang", reason="needs SGLang: run `nox -s e2e_sglang`")

VERSION = "0.5.23"
# The CPU recipe of e2e/sglang_env: torch-native attention and sampling, no CUDA graphs, a
# small KV pool (launch_spec adds --sleep-on-idle and --enable-metrics itself).
SERVER_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--disable-cuda-graph",
    "--max-total-tokens", "4096",
]  # fmt: skip
HEALTH_TIMEOUT_S = 180
CONCURRENT = 4
MAX_TOKENS = 16  # with ignore_eos: 1 prefill + 15 decode passes per request, well over 4 + 1
FORWARD_STEPS = 4
TRACE_WAIT_S = 30


def _config(save_path: Path, steps: list[int], **more: Any) -> aprof.ProfilerConfig:
    return aprof.load_config(
        {
            **more,
            # A stop (which moves and counts the traces) may outlast these short steps: wait
            # for it, or the next window may be skipped by design.
            "global_profiler": {
                "steps": steps,
                "save_path": str(save_path),
                "wait_for_stops": True,
            },
            "rollout": {"forward_steps": FORWARD_STEPS},
            "tool_config": {"torch": {"contents": ["cpu"]}},
            "timeouts": {"connect_s": 10, "start_s": 60, "stop_s": 120},
        }
    )


def _spec(cfg: aprof.ProfilerConfig, model: Path, env: dict[str, str]) -> LaunchSpec:
    spec = launch_spec(
        "sglang",
        cfg,
        version=VERSION,
        model=str(model),
        port=free_port(),
        server_args=SERVER_ARGS,
    )
    return dataclasses.replace(spec, env={**spec.env, **env})


async def _launch(spec: LaunchSpec, tmp_path: Path) -> LaunchedServer:
    return await launch(spec, log_path=tmp_path / "sglang.log", health_timeout_s=HEALTH_TIMEOUT_S)


def _body(model: Path, prompt: str) -> dict[str, Any]:
    return {
        "model": str(model),
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


async def _complete(
    http: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Any:
    async with http.post(f"{base_url}/v1/completions", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def _traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.trace.json.gz")) if folder.is_dir() else []


async def _wait_for_traces(folder: Path, timeout_s: float) -> list[Path]:
    """The traces in ``folder`` once one is there (SGLang writes it at the auto-stop)."""
    deadline = time.monotonic() + timeout_s
    while not (found := _traces(folder)):
        assert time.monotonic() < deadline, f"no trace in {folder} after {timeout_s} s"
        await asyncio.sleep(0.2)
    return found


async def test_smoke_server_profiles_num_steps(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """The environment works: healthy, serves, and ``/start_profile`` with ``num_steps`` 4
    writes one trace holding 4 forward passes (``step[...]`` annotations)."""
    cfg = _config(tmp_path / "profile", [1])
    spec = _spec(cfg, tiny_model, owned_env)
    out = tmp_path / "by-hand"
    async with await _launch(spec, tmp_path) as server:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            answer = await _complete(http, server.base_url, _body(tiny_model, "hello world"))
            assert answer["usage"]["completion_tokens"] == MAX_TOKENS, answer
            start = {
                "output_dir": str(out),
                "num_steps": FORWARD_STEPS,
                "activities": ["CPU"],
                "with_stack": False,
                "record_shapes": False,
            }
            async with http.post(f"{server.base_url}/start_profile", json=start) as response:
                assert response.status == 200, await response.text()
                assert await response.text() == "Start profiling.\n"
            await _complete(http, server.base_url, _body(tiny_model, "the quick brown fox"))
            traces = await _wait_for_traces(out, TRACE_WAIT_S)
            # After the auto-stop nothing runs: a stop is refused with a plain 500.
            async with http.post(f"{server.base_url}/stop_profile") as response:
                assert response.status == 500, await response.text()
    assert len(traces) == 1, traces
    assert traces[0].name.endswith("-TP-0.trace.json.gz"), traces
    assert count_sglang_steps(traces[0]) == FORWARD_STEPS


async def _run_steps(
    prof: aprof.Profiler,
    base_url: str,
    model: Path,
    num_steps: int,
    *,
    kill_in_step: int | None = None,
    server: LaunchedServer | None = None,
) -> tuple[list[Any], list[str]]:
    """``num_steps`` steps of concurrent completions, each inside ``prof.request``; with
    ``kill_in_step`` the server is SIGKILLed as that step's window has started. Returns the
    answers and the errors of failed requests (a rollout survives a dead server)."""
    answers: list[Any] = []
    errors: list[str] = []

    async def complete(http: aiohttp.ClientSession, step: int, i: int) -> None:
        try:
            async with prof.request(replica=0, request_id=f"s{step}-r{i}") as req:
                body = _body(model, f"step {step} {i}")
                assert req.traceparent is not None and req.tracestate is not None
                headers = {"traceparent": req.traceparent, "tracestate": req.tracestate}
                answers.append(await _complete(http, base_url, body, headers))
        except (TimeoutError, aiohttp.ClientError) as exc:
            errors.append(f"step {step} request {i}: {exc!r}")

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for step in range(1, num_steps + 1):
            async with prof.step(step):
                if step == kill_in_step:
                    assert server is not None
                    # Admitted once the window's start was answered: the capture is running.
                    async with prof.request(replica=0, request_id=f"s{step}-probe"):
                        os.killpg(server.pid, signal.SIGKILL)
                        await asyncio.wait_for(server.process.wait(), timeout=30)
                await asyncio.gather(*(complete(http, step, i) for i in range(CONCURRENT)))
    return answers, errors


def _window_summary(prof: aprof.Profiler) -> list[dict[str, Any]]:
    return [
        {
            "step": w.step,
            "state": w.state,
            "stop_reason": w.stop_reason,
            "observed": w.forward_steps.observed,
            "error": w.error,
            "files": [f.path for f in w.files],
        }
        for w in prof.manifest.windows
    ]


async def test_profiled_steps_auto_stop_after_forward_steps(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """Steps [1, 2, 5] of 6 through the adapter: three windows, each auto-stopped by the
    server after 4 forward passes, its trace in the step's folder and nothing left behind;
    SGLang's own request spans (``otel`` on, ``--enable-trace`` from ``launch_spec``)
    received by aprof, each request's under its aprof request, merged and reported."""
    save_path = tmp_path / "profile"
    cfg = _config(save_path, [1, 2, 5], otel={"receive": True, "port": free_port()})
    spec = _spec(cfg, tiny_model, owned_env)
    server = await _launch(spec, tmp_path)
    async with server, aprof.Profiler(cfg) as prof:
        prof.add_target(server.adapter(replica=0))
        answers, errors = await _run_steps(prof, server.base_url, tiny_model, 6)
        await _phases_arrive(save_path, 6)
    _assert_sglangs_spans(save_path, 6)
    _assert_merged_and_reported(save_path, [1, 2, 5])
    assert errors == []
    assert len(answers) == 6 * CONCURRENT
    summary = _window_summary(prof)
    window = {
        "target": "replica_0",
        "state": "done",
        "stop_reason": "auto_stop",
        "forward_steps.requested": FORWARD_STEPS,
        "forward_steps.observed": FORWARD_STEPS,
        "forward_steps.enforced_by": "server",
    }
    assert_windows(prof.manifest, [{**window, "step": n} for n in (1, 2, 5)])
    for record in prof.manifest.windows:
        files = [f.path for f in record.files]
        assert files, summary
        assert all(f.startswith(f"step_{record.step}/rollout/replica_0/") for f in files), files
        traces = [save_path / f for f in files if f.endswith(".trace.json.gz")]
        assert [count_sglang_steps(t) for t in traces] == [FORWARD_STEPS], summary
    assert spec.profiler_dir is not None
    left = list(spec.profiler_dir.iterdir()) if spec.profiler_dir.is_dir() else []
    assert left == [], "traces left behind in the server's own trace folder"


def _served(save_path: Path, step: int) -> dict[str, Any]:
    """What SGLang said of each request of ``step`` (``aprof._otel.served``), by span id."""
    from aprof._otel import otel_folder, read_step, served

    with otel_folder(save_path) as folder:
        found = None if folder is None else read_step(folder, step)
    return {} if found is None else served(found.spans)[0]


async def _phases_arrive(save_path: Path, num_steps: int) -> None:
    """Wait (at most 60 s) until every request's three phases are in its step's file: SGLang's
    tokenizer and scheduler processes export their spans each on their own schedule (every
    500 ms, as ``launch_spec`` sets it)."""

    def complete() -> bool:
        for step in range(1, num_steps + 1):
            found = _served(save_path, step)
            if len(found) < CONCURRENT:
                return False
            if any(
                {p.name for p in r.phases} != {"queued", "prefill", "decode"}
                for r in found.values()
            ):
                return False
        return True

    async with asyncio.timeout(60):
        # A condition polled, bounded: the spans come from other processes, on their schedule.
        while not complete():  # noqa: ASYNC110
            await asyncio.sleep(0.2)


def _assert_sglangs_spans(save_path: Path, num_steps: int) -> None:
    """SGLang's root span of each request (`` Req <rid>``) is the child of the request's own
    span (the client's trace id carried), with the replica its tracestate named, SGLang's
    latency attributes, and its stages below it as queued, prefill and decode, in order."""
    from aprof._timeline.recorder import span_id_of

    for step in range(1, num_steps + 1):
        found = _served(save_path, step)
        assert sorted(found) == sorted(span_id_of(f"s{step}-r{i}") for i in range(CONCURRENT))
        for request in found.values():
            assert request.name.startswith(" Req ") and request.replica == 0
            assert [p.name for p in request.phases] == ["queued", "prefill", "decode"]
            assert request.attributes["gen_ai.latency.e2e"] > 0
            assert request.begin_ns <= request.phases[0].begin_ns
            assert request.phases[-1].end_ns <= request.end_ns


def _assert_merged_and_reported(save_path: Path, profiled: list[int]) -> None:
    """``aprof merge`` nests each SGLang request span and its phases under its request;
    ``aprof report`` gives each step's server side, for replica 0, from the same spans."""
    import gzip
    import json

    from aprof._report import accounting
    from aprof._report.document import document

    for merged in aprof.merge(save_path, steps=profiled[:1]):
        with gzip.open(merged.path, "rt") as f:
            events = json.load(f)["traceEvents"]
        served = [e for e in events if e.get("cat") == "aprof.server"]
        assert sum(e["name"].startswith(" Req ") for e in served) == CONCURRENT
        assert sorted(e["name"] for e in served if not e["name"].startswith(" Req ")) == sorted(
            ["queued", "prefill", "decode"] * CONCURRENT
        )
    steps = {s["step"]: s for s in document(accounting(save_path))["steps"]}
    for step in range(1, 7):
        side = steps[step]["server"]
        expected = _served(save_path, step).values()
        assert side["spans"] == CONCURRENT
        assert [(r["replica"], r["spans"]) for r in side["replicas"]] == [(0, CONCURRENT)]
        for phase in ("queued", "prefill", "decode"):
            total = sum(r.seconds(phase) for r in expected)
            assert side[f"{phase}_s"]["sum"] == pytest.approx(total)
        for slow in side["slowest"]:
            assert slow["server"] is not None and slow["server"]["gap_s"] >= 0


async def test_server_killed_mid_window_fails_only_that_window(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """SIGKILL to the server while step 2's window runs: step 1's window is done, step 2's
    failed, step 3's cannot start; no exception reaches the loop, the profiler closes."""
    save_path = tmp_path / "profile"
    cfg = _config(save_path, [1, 2, 3])
    spec = _spec(cfg, tiny_model, owned_env)
    server = await _launch(spec, tmp_path)
    async with server, aprof.Profiler(cfg) as prof:
        prof.add_target(server.adapter(replica=0))
        answers, errors = await _run_steps(
            prof, server.base_url, tiny_model, 4, kill_in_step=2, server=server
        )
    assert len(answers) == CONCURRENT, (answers, errors)  # step 1's; later ones fail
    assert len(errors) == 3 * CONCURRENT, errors
    summary = _window_summary(prof)
    assert_windows(
        prof.manifest,
        [
            {"step": 1, "target": "replica_0", "state": "done", "stop_reason": "auto_stop"},
            {"step": 2, "target": "replica_0", "state": "failed"},
            {"step": 3, "target": "replica_0", "state": "failed"},
        ],
    )
    for record in prof.manifest.windows[1:]:
        assert record.error, summary
    assert (save_path / "manifest.json").is_file()


async def test_the_demo_profiles_a_running_sglang_server(
    tmp_path: Path, tiny_model: Path, owned_env: dict[str, str]
) -> None:
    """``aprof demo --server sglang URL`` against the real server: its windows auto-stop after
    the forward steps asked for, and their traces land in the demo's folders."""
    cfg = _config(tmp_path / "launch", [1])
    spec = _spec(cfg, tiny_model, owned_env)
    out = tmp_path / "demo"
    async with await _launch(spec, tmp_path) as server:
        demo = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aprof", "demo", "--server", "sglang", server.base_url,
            "--num-steps", "3", "--steps", "1,3", "--concurrency", "4",
            "--forward-steps", str(FORWARD_STEPS), "--out", str(out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(demo.communicate(), timeout=600)
    output = (stdout + stderr).decode()
    assert demo.returncode == 0, output
    window = {"target": "replica_0", "state": "done", "stop_reason": "auto_stop"}
    assert_windows(
        out,
        [{**window, "step": n, "forward_steps.observed": FORWARD_STEPS} for n in (1, 3)]
        + [{"step": n, "target": "trainer", "state": "done"} for n in (1, 3)],
    )
    for record in aprof.load_manifest(out).windows:
        if record.kind == "rollout":
            names = [Path(f.path).name for f in record.files]
            assert [n for n in names if n.endswith("-TP-0.trace.json.gz")], names
    assert "Traceback" not in output, output
