"""Both adapters when the server misbehaves: down, refusing, hanging, crashing, restarting,
or asking for a key. Each fault costs its own window only. Nothing sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import Complete, ReferenceFactory

import aprof
from aprof.testing import assert_windows
from servers import SGLangServer, VLLMServer
from servers.process import free_port
from servers.reference import Faults, ReferenceConfig, ReferenceServer, forward_step_numbers, serve

TIMEOUTS = {"start_s": 30, "stop_s": 30, "poll_s": 0.005, "connect_s": 5}
Target = VLLMServer | SGLangServer


def config(
    save: Path, steps: list[int], *, forward_steps: int | None = 4, **timeouts: float
) -> aprof.ProfilerConfig:
    """Profile ``steps``, each waiting for its stops (a window queued behind the previous
    stop would not gate the next step's request); ``timeouts`` override the defaults."""
    return aprof.load_config(
        {
            "global_profiler": {"steps": steps, "save_path": str(save), "wait_for_stops": True},
            "rollout": {"forward_steps": forward_steps},
            "timeouts": {**TIMEOUTS, **timeouts},
        }
    )


def adapter(dialect: str, url: str, **kwargs: Any) -> Target:
    if dialect == "vllm":
        return VLLMServer(url, replica=0, **kwargs)
    return SGLangServer(url, replica=0, **kwargs)


def window(folder: Path, prefix: str, *, forward_steps: int | None = 4) -> aprof.Window:
    folder.mkdir(parents=True, exist_ok=True)
    return aprof.Window(
        step=1,
        target="replica_0",
        kind="rollout",
        delay=0,
        forward_steps=forward_steps,
        dir=folder,
        prefix=prefix,
    )


async def one_step(
    prof: aprof.Profiler, n: int, server: ReferenceServer | None, complete: Complete
) -> None:
    async with prof.step(n), prof.request(replica=0):
        if server is not None:
            await complete(server, max_tokens=12)


@pytest.mark.parametrize(
    ("dialect", "kwargs"),
    [("vllm", {}), ("vllm", {"version": "0.32.0"}), ("sglang", {})],
)
async def test_server_down_at_start_fails_the_window(
    complete: Complete, tmp_path: Path, dialect: str, kwargs: dict[str, Any]
) -> None:
    prof = aprof.Profiler(config(tmp_path / "profile", [1]))
    prof.add_target(adapter(dialect, f"http://127.0.0.1:{free_port()}", **kwargs))
    async with asyncio.timeout(60), prof:
        await one_step(prof, 1, None, complete)
    assert_windows(prof.manifest, [{"step": 1, "state": "failed", "stop_reason": "error"}])
    error = prof.manifest.windows[0].error
    assert error is not None and "start failed: ClientConnectorError" in error


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_500_on_start_fails_the_window(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, dialect: str
) -> None:
    faults = Faults(fail_routes=frozenset({"/start_profile"}))
    prof = aprof.Profiler(config(tmp_path / "profile", [1, 2]))
    async with asyncio.timeout(60), reference_server(dialect=dialect, faults=faults) as server:
        prof.add_target(adapter(dialect, server.url))
        async with prof:
            for n in (1, 2):
                await one_step(prof, n, server, complete)
    assert_windows(prof.manifest, [{"step": n, "state": "failed"} for n in (1, 2)])
    error = prof.manifest.windows[0].error
    assert error is not None and "/start_profile answered 500" in error


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_hanging_stop_times_the_window_out(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, dialect: str
) -> None:
    # Unbounded, so that SGLang is asked to stop too.
    prof = aprof.Profiler(config(tmp_path / "profile", [1], forward_steps=None, stop_s=1))
    faults = Faults(hang_stop=True)
    async with asyncio.timeout(60), reference_server(dialect=dialect, faults=faults) as server:
        prof.add_target(adapter(dialect, server.url))
        async with prof:
            await one_step(prof, 1, server, complete)
    assert_windows(prof.manifest, [{"step": 1, "state": "timeout"}])
    assert prof.manifest.windows[0].error == "stop timed out after 1s"


async def test_vllm_stops_what_an_interrupted_stop_left_before_the_next_start(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    faults = Faults(stop_delay_s=1.0)
    async with asyncio.timeout(60), reference_server(faults=faults) as server:
        target = VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir)
        await target.open(aprof.TimeoutsConfig(**{**TIMEOUTS, "stop_s": 0.2}))
        first = window(tmp_path / "first", "first")
        await target.start(first)
        with pytest.raises(TimeoutError):
            await target.stop(first)
        await target.open(aprof.TimeoutsConfig(**TIMEOUTS))  # longer bounds from now on
        second = window(tmp_path / "second", "second")
        await target.start(second)  # no 409: the interrupted session was stopped first
        await complete(server, max_tokens=8)
        result = await target.stop(second)
        await target.aclose()
    assert result.files and all(p.name.startswith("second_") for p in result.files)
    assert any(
        e["event"] == "stopping what an interrupted call may have left running" for e in logs
    )


async def test_vllm_stops_what_an_interrupted_start_left_before_the_next_start(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    faults = Faults(start_delay_s=1.0)
    async with asyncio.timeout(60), reference_server(faults=faults) as server:
        target = VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir)
        await target.open(aprof.TimeoutsConfig(**{**TIMEOUTS, "start_s": 0.2}))
        with pytest.raises(TimeoutError):
            await target.start(window(tmp_path / "first", "first"))
        await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        second = window(tmp_path / "second", "second")
        await target.start(second)
        await complete(server, max_tokens=8)
        result = await target.stop(second)
        await target.aclose()
    assert result.files and all(p.name.startswith("second_") for p in result.files)
    cleanup = "stopping what an interrupted call may have left running"
    assert [e["event"] for e in logs].count(cleanup) == 1


async def test_sglang_stops_what_an_interrupted_stop_left_before_the_next_start(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path
) -> None:
    faults = Faults(stop_delay_s=1.0)
    async with asyncio.timeout(60), reference_server(dialect="sglang", faults=faults) as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(aprof.TimeoutsConfig(**{**TIMEOUTS, "stop_s": 0.2}))
        first = window(tmp_path / "first", "first", forward_steps=None)
        await target.start(first)
        with pytest.raises(TimeoutError):
            await target.stop(first)
        await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        # The cut-off stop lands late; the start waits for its own cleanup stop (500:
        # nothing left), so the late stop cannot end the new capture.
        second = window(tmp_path / "second", "second", forward_steps=None)
        await target.start(second)
        before = server.forward_steps
        await complete(server, max_tokens=5)
        result = await target.stop(second)
        await target.aclose()
    (trace,) = result.files
    assert forward_step_numbers(trace) == list(range(before + 1, before + 6))


async def test_vllm_before_030_never_sends_a_stop_to_clean_up(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    faults = Faults(stop_delay_s=1.0)
    async with (
        asyncio.timeout(60),
        reference_server(vllm_version="0.20.0", faults=faults) as server,
    ):
        target = VLLMServer(server.url, replica=0)
        await target.open(aprof.TimeoutsConfig(**{**TIMEOUTS, "stop_s": 0.2}))
        first = window(tmp_path / "first", "first")
        await target.start(first)
        with pytest.raises(TimeoutError):
            await target.stop(first)
        await target.start(window(tmp_path / "second", "second"))
        stops = [
            e for e in logs if e["event"] == "server answered" and e["path"] == "/stop_profile"
        ]
        await target.aclose()
    assert stops == []
    assert any("not stopped on this version" in e["event"] for e in logs)


@contextlib.asynccontextmanager
async def subprocess_server(*args: str) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``aprof serve-reference`` on a free port; yields its URL and process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aprof",
        "serve-reference",
        "--port",
        "0",
        "--log-format",
        "json",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(120):
            url = await _listening_url(proc.stderr)
        # Keep reading so the server never blocks on a full pipe.
        drain = asyncio.create_task(_drain(proc.stderr))
        yield url, proc
    finally:
        if proc.returncode is None:
            proc.kill()
        async with asyncio.timeout(30):
            await proc.wait()
        if drain is not None:
            drain.cancel()


async def _listening_url(stream: asyncio.StreamReader) -> str:
    while line := await stream.readline():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "reference server listening":
                return str(event["url"])
    raise AssertionError("the reference server exited before listening")


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def test_crash_mid_window_fails_the_window(tmp_path: Path) -> None:
    save = tmp_path / "profile"
    # Unbounded: the stop comes at the step's end, after the request, not when the server's
    # counter says its capture is over.
    prof = aprof.Profiler(config(save, [1], forward_steps=None))
    traces = tmp_path / "traces"
    args = ("--profiler-dir", str(traces), "--crash-on", "/stop_profile")
    async with asyncio.timeout(180), subprocess_server(*args) as (url, proc):
        prof.add_target(VLLMServer(url, replica=0, profiler_dir=traces))
        body = {"model": "reference", "prompt": "hi", "max_tokens": 12}
        async with (
            aiohttp.ClientSession() as http,
            prof,
            prof.step(1),
            prof.request(replica=0),
            http.post(f"{url}/v1/completions", json=body) as response,
        ):
            assert response.status == 200
        assert await proc.wait() == 1
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    error = prof.manifest.windows[0].error
    assert error is not None and error.startswith("stop failed: ServerDisconnectedError")


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_server_restarted_between_steps(
    complete: Complete, tmp_path: Path, dialect: str
) -> None:
    cfg = ReferenceConfig(dialect=dialect, profiler_dir=tmp_path / "traces")
    # Each step waits for its stop, so the first server is idle when it goes away.
    prof = aprof.Profiler(config(tmp_path / "profile", [1, 2]))
    async with asyncio.timeout(120), contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(serve(cfg))
        prof.add_target(adapter(dialect, first.url, **_dir(dialect, cfg)))
        async with prof:
            await one_step(prof, 1, first, complete)
            await stack.aclose()
            async with serve(cfg, port=first.port) as second:
                await one_step(prof, 2, second, complete)
    expected = {"state": "done", "forward_steps.observed": 4, "stop_reason": "auto_stop"}
    assert_windows(prof.manifest, [{"step": n, **expected} for n in (1, 2)])
    assert all(record.files for record in prof.manifest.windows)


def _dir(dialect: str, cfg: ReferenceConfig) -> dict[str, Any]:
    return {"profiler_dir": cfg.profiler_dir} if dialect == "vllm" else {}


@pytest.mark.parametrize(("key", "state"), [(None, "failed"), ("s3cret", "done")])
async def test_sglang_profile_routes_need_the_bearer_key(
    reference_server: ReferenceFactory,
    complete: Complete,
    tmp_path: Path,
    key: str | None,
    state: str,
) -> None:
    prof = aprof.Profiler(config(tmp_path / "profile", [1]))
    async with (
        asyncio.timeout(60),
        reference_server(dialect="sglang", api_key="s3cret") as server,
    ):
        prof.add_target(SGLangServer(server.url, replica=0, api_key=key))
        async with prof, prof.step(1), prof.request(replica=0):
            await _authorized_completion(server, "s3cret")
    assert_windows(prof.manifest, [{"step": 1, "state": state}])
    if key is None:
        error = prof.manifest.windows[0].error
        assert error is not None and "/start_profile answered 401" in error


@pytest.mark.parametrize("key", [None, "s3cret"])
async def test_vllm_profile_routes_are_open_with_or_without_the_key(
    reference_server: ReferenceFactory, tmp_path: Path, key: str | None
) -> None:
    # vLLM's --api-key guards only /v1 and the like; the adapter sends a key if it has one.
    prof = aprof.Profiler(config(tmp_path / "profile", [1]))
    async with asyncio.timeout(60), reference_server(api_key="s3cret") as server:
        prof.add_target(VLLMServer(server.url, replica=0, api_key=key))
        async with prof, prof.step(1), prof.request(replica=0):
            await _authorized_completion(server, "s3cret")
    assert_windows(prof.manifest, [{"step": 1, "state": "done"}])


async def _authorized_completion(server: ReferenceServer, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": server.cfg.model_name, "prompt": "hi", "max_tokens": 12}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(f"{server.url}/v1/completions", json=body, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
