"""Contract tests of the reference server's vLLM dialect, era by era, over real HTTP.

Each expectation is a fact of ``reference/vllm.md`` (sections 1, 4, 6, 8, 14).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from servers.reference import ReferenceServer, forward_step_numbers, load_trace

if TYPE_CHECKING:
    # For annotations only: at run time the name `conftest` may mean tests/conftest.py.
    from conftest import Complete, ReferenceFactory


CONFLICT = {
    "error": {
        "message": "A profiling session is already active. "
        "Call /stop_profile before starting another session.",
        "type": "Conflict",
        "param": None,
        "code": 409,
    }
}
FRONTEND = re.compile(
    rf"^{re.escape(socket.gethostname())}_{os.getpid()}\.async_llm\.\d+\.pt\.trace\.json\.gz$"
)


async def post(
    http: aiohttp.ClientSession, server: ReferenceServer, path: str, body: Any = None
) -> tuple[int, str]:
    async with http.post(f"{server.url}{path}", json=body) as response:
        return response.status, await response.text()


def worker_traces(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.pt.trace.json.gz") if "async_llm" not in p.name)


@pytest.mark.parametrize("version", ["0.11.0", "0.32.0"])
async def test_profile_routes_are_absent_without_profiling(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, version: str
) -> None:
    async with (
        asyncio.timeout(30),
        reference_server(vllm_version=version, profiling=False) as server,
    ):
        for path in ("/start_profile", "/stop_profile"):
            status, text = await post(http, server, path)
            assert (status, json.loads(text)) == (404, {"detail": "Not Found"})
        async with http.get(f"{server.url}/version") as response:
            assert await response.json() == {"version": version}


async def test_get_on_profile_routes_is_405(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server() as server:
        for path in ("/start_profile", "/stop_profile"):
            async with http.get(f"{server.url}{path}") as response:
                assert response.status == 405
                assert await response.json() == {"detail": "Method Not Allowed"}


async def test_032_session_409_and_stop_noops(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(60), reference_server(vllm_version="0.32.0") as server:
        assert server.profiler_dir is not None
        assert await post(http, server, "/stop_profile") == (200, "")
        assert await post(http, server, "/start_profile") == (200, "")
        status, text = await post(http, server, "/start_profile")
        assert (status, json.loads(text)) == (409, CONFLICT)
        await complete(server, max_tokens=3)
        assert await post(http, server, "/stop_profile") == (200, "")
        assert await post(http, server, "/stop_profile") == (200, "")
        names = {p.name for p in server.profiler_dir.iterdir()}
    (worker,) = worker_traces(server.profiler_dir)
    assert re.fullmatch(r"rank0\.\d+\.pt\.trace\.json\.gz", worker.name)
    (frontend,) = names - {worker.name, "rank0.profiler_out.txt"}
    assert FRONTEND.match(frontend)
    trace = load_trace(worker)
    assert trace["vllm_version"] == "0.32.0"
    assert forward_step_numbers(worker) == [1, 2, 3]
    labels = {e["name"] for e in trace["traceEvents"] if e["name"].startswith("execute_")}
    assert labels == {
        "execute_context_1(5)_generation_0(0)",
        "execute_context_0(0)_generation_1(1)",
    }


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"profile_prefix": "bad/name"}, "body.profile_prefix", "profile_prefix must be"),
        ({"profile_prefix": ""}, "body.profile_prefix", "profile_prefix must be"),
        ({"profile_prefix": "a" * 129}, "body.profile_prefix", "profile_prefix must be"),
        ({"delay_iterations": "2"}, "body.delay_iterations", "valid integer"),
        ({"max_iterations": True}, "body.max_iterations", "valid integer"),
        ({"max_iterations": -1}, "body.max_iterations", "max_iterations must be greater"),
        ({"delay_iterations": -1}, "body.delay_iterations", "delay_iterations must be greater"),
    ],
)
async def test_032_start_body_validation(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    body: dict[str, Any],
    param: str,
    message: str,
) -> None:
    async with asyncio.timeout(30), reference_server() as server:
        status, text = await post(http, server, "/start_profile", body)
        error = json.loads(text)["error"]
        assert (status, error["type"], error["param"], error["code"]) == (
            400,
            "BadRequestError",
            param,
            400,
        )
        assert message in error["message"]
        # A refused start leaves no session behind.
        assert await post(http, server, "/start_profile", {"unknown_field": 1}) == (200, "")


async def test_032_auto_stop_records_exactly_n_with_vllm_delay_semantics(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(60), reference_server() as server:
        assert server.profiler_dir is not None
        await complete(server, max_tokens=2)
        before = server.forward_steps
        body = {"profile_prefix": "run2", "delay_iterations": 3, "max_iterations": 2}
        assert await post(http, server, "/start_profile", body) == (200, "")
        await complete(server, max_tokens=8)
        # The worker trace is written at the auto-stop, before any /stop_profile.
        (trace,) = worker_traces(server.profiler_dir)
        assert re.fullmatch(r"run2_rank0\.\d+\.pt\.trace\.json\.gz", trace.name)
        # vLLM starts in the delay-th iteration after the start and records it.
        assert forward_step_numbers(trace) == [before + 3, before + 4]
        status, text = await post(http, server, "/start_profile")
        assert (status, json.loads(text)) == (409, CONFLICT)
        assert await post(http, server, "/stop_profile") == (200, "")
        frontends = [p.name for p in server.profiler_dir.glob("run2_*async_llm*")]
        assert len(frontends) == 1
        assert await post(http, server, "/start_profile") == (200, "")
        status, _ = await post(http, server, "/start_profile")
        assert status == 409


@pytest.mark.parametrize("version", ["0.13.0", "0.16.0"])
async def test_launch_time_window_ignores_the_body_before_032(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    version: str,
) -> None:
    async with (
        asyncio.timeout(60),
        reference_server(vllm_version=version, launch_max_iterations=3) as server,
    ):
        assert server.profiler_dir is not None
        before = server.forward_steps
        body = {"profile_prefix": "ignored", "max_iterations": 1}
        assert await post(http, server, "/start_profile", body) == (200, "")
        await complete(server, max_tokens=6)
        (trace,) = worker_traces(server.profiler_dir)
        assert re.fullmatch(r"[0-9a-f]{5}-rank-0\.\d+\.pt\.trace\.json\.gz", trace.name)
        assert forward_step_numbers(trace) == [before + 1, before + 2, before + 3]
        assert await post(http, server, "/stop_profile") == (200, "")


@pytest.mark.parametrize(
    ("version", "status"),
    [("0.11.0", 500), ("0.16.0", 500), ("0.29.0", 500), ("0.30.0", 200), ("0.32.0", 200)],
)
async def test_stop_with_nothing_running_by_era(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, version: str, status: int
) -> None:
    async with asyncio.timeout(30), reference_server(vllm_version=version) as server:
        got, text = await post(http, server, "/stop_profile")
        assert got == status
        if status == 500:
            assert text == "Internal Server Error"


async def test_era_a_double_start_restarts_and_names_host_pid(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(60), reference_server(vllm_version="0.11.0") as server:
        assert server.profiler_dir is not None
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=2)
        middle = server.forward_steps
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=2)
        assert await post(http, server, "/stop_profile") == (200, "")
        assert (await post(http, server, "/stop_profile"))[0] == 500
        (trace,) = worker_traces(server.profiler_dir)
    pattern = rf"{re.escape(socket.gethostname())}_{os.getpid()}\.\d+\.pt\.trace\.json\.gz"
    assert re.fullmatch(pattern, trace.name)
    assert forward_step_numbers(trace) == [middle + 1, middle + 2]
    assert not list(server.profiler_dir.glob("*.profiler_out.txt"))


async def test_era_c_double_start_is_ignored(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(60), reference_server(vllm_version="0.16.0") as server:
        assert server.profiler_dir is not None
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=2)
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=2)
        assert await post(http, server, "/stop_profile") == (200, "")
        (trace,) = worker_traces(server.profiler_dir)
        assert forward_step_numbers(trace) == [1, 2, 3, 4]


@pytest.mark.parametrize(("version", "second_capture"), [("0.16.0", False), ("0.30.0", True)])
async def test_start_after_auto_stop_before_032(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    version: str,
    second_capture: bool,
) -> None:
    """Before 0.29 an auto-stopped worker ignores starts until a stop; from 0.29 it restarts."""
    async with (
        asyncio.timeout(60),
        reference_server(vllm_version=version, launch_max_iterations=2) as server,
    ):
        assert server.profiler_dir is not None
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=3)
        assert len(worker_traces(server.profiler_dir)) == 1
        assert await post(http, server, "/start_profile") == (200, "")
        await complete(server, max_tokens=3)
        assert len(worker_traces(server.profiler_dir)) == (2 if second_capture else 1)
        assert await post(http, server, "/stop_profile") == (200, "")


async def test_forward_counter_in_metrics(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(30), reference_server() as server:
        await complete(server, max_tokens=5)
        async with http.get(f"{server.url}/metrics") as response:
            text = await response.text()
        match = re.search(r"^vllm:iteration_tokens_total_count\{[^}]*\} (\S+)$", text, re.M)
        assert match is not None
        assert float(match.group(1)) == server.forward_steps == 5
        assert 'vllm:iteration_tokens_total_sum{engine="0",model_name="reference"} 9.0' in text


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
async def test_033_profiler_kwargs_reach_torch_and_a_bad_one_records_nothing(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    version: str,
) -> None:
    async with asyncio.timeout(60), reference_server(vllm_version=version) as server:
        assert server.profiler_dir is not None
        body = {"profile_prefix": "good", "profiler_kwargs": {"record_shapes": True}}
        assert await post(http, server, "/start_profile", body) == (200, "")
        await complete(server, max_tokens=2)
        assert await post(http, server, "/stop_profile") == (200, "")
        body = {"profile_prefix": "bad", "profiler_kwargs": {"no_such_option": 1}}
        # As in vLLM, a profiler that fails to start is only logged.
        assert await post(http, server, "/start_profile", body) == (200, "")
        assert await post(http, server, "/stop_profile") == (200, "")
        names = [p.name for p in worker_traces(server.profiler_dir)]
    assert len(names) == 1
    assert names[0].startswith("good_rank0.")
