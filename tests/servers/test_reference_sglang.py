"""Contract tests of the reference server's SGLang dialect over real HTTP.

Each expectation is a fact of ``reference/sglang.md`` (sections 1-6, SGLang 0.5.23); those of
its section 12 table were observed on a real SGLang 0.5.23 server (CPU build), which this
dialect of the reference server stands in for in tests.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from servers.reference import ReferenceServer, forward_step_numbers
from servers.reference.trace_files import load_trace
from servers.trace_files import count_sglang_steps

STARTED = "Start profiling.\n"
STOPPED = "Stop profiling. This will take some time.\n"
QUIET = {"with_stack": False, "record_shapes": False}

if TYPE_CHECKING:
    # For annotations only: at run time the name `conftest` may mean tests/conftest.py.
    from conftest import Complete, ReferenceFactory


async def call(
    http: aiohttp.ClientSession,
    server: ReferenceServer,
    path: str,
    body: Any = None,
    method: str = "POST",
) -> tuple[int, str]:
    async with http.request(method, f"{server.url}{path}", json=body) as response:
        return response.status, await response.text()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_start_and_stop_write_one_trace_per_call_dir(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
    method: str,
) -> None:
    out = tmp_path / "call"
    body = {"output_dir": str(out), "profile_id": "p7", "profile_prefix": "step1", **QUIET}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        assert await call(http, server, "/start_profile", body, method) == (200, STARTED)
        await complete(server, max_tokens=3)
        assert await call(http, server, "/stop_profile", method=method) == (200, STOPPED)
    assert [p.name for p in out.iterdir()] == ["step1-p7-TP-0.trace.json.gz"]
    assert forward_step_numbers(out / "step1-p7-TP-0.trace.json.gz") == [1, 2, 3]


async def test_default_output_dir_and_profile_id(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        assert await call(http, server, "/start_profile", method="GET") == (200, STARTED)
        assert await call(http, server, "/stop_profile") == (200, STOPPED)
    (trace,) = (tmp_path / "traces").iterdir()
    assert re.fullmatch(r"\d+\.\d+-TP-0\.trace\.json\.gz", trace.name)


async def test_stop_with_nothing_running_is_500(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        assert await call(http, server, "/stop_profile") == (500, "Internal Server Error")


async def test_num_steps_records_exactly_n_then_stop_is_500(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
) -> None:
    body = {"output_dir": str(tmp_path / "n"), "profile_id": "a", "num_steps": "3", **QUIET}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        await complete(server, max_tokens=2)
        before = server.forward_steps
        assert await call(http, server, "/start_profile", body) == (200, STARTED)
        await complete(server, max_tokens=6)
        trace = tmp_path / "n" / "a-TP-0.trace.json.gz"
        assert forward_step_numbers(trace) == [before + 1, before + 2, before + 3]
        assert await call(http, server, "/stop_profile") == (500, "Internal Server Error")


@pytest.mark.parametrize(("offset", "first"), [(3, 3), (-5, 1)])
async def test_start_step_is_absolute(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
    offset: int,
    first: int,
) -> None:
    """``start_step`` counts batches since launch; a past one means "the next batch"."""
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        await complete(server, max_tokens=4)
        now = server.forward_steps
        body = {
            "output_dir": str(tmp_path / "s"),
            "profile_id": "s",
            "start_step": now + offset,
            "num_steps": 2,
            **QUIET,
        }
        assert await call(http, server, "/start_profile", body) == (200, STARTED)
        await complete(server, max_tokens=first + 3)
        assert await call(http, server, "/stop_profile") == (500, "Internal Server Error")
        trace = tmp_path / "s" / "s-TP-0.trace.json.gz"
        assert forward_step_numbers(trace) == [now + first, now + first + 1]


async def test_start_step_start_while_in_progress_is_500(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        body = {"start_step": 1, "num_steps": 50, **QUIET}
        assert await call(http, server, "/start_profile", body) == (200, STARTED)
        await complete(server, max_tokens=2)
        status, text = await call(http, server, "/start_profile", body)
        assert (status, text) == (500, "Internal Server Error")
        assert await call(http, server, "/stop_profile") == (200, STOPPED)


async def test_plain_double_start_silently_restarts_the_first_capture(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
) -> None:
    # Observed on 0.5.23: 200 again; the steps so far are lost, the first call's output
    # dir, id and stop target stay.
    first = {"output_dir": str(tmp_path / "d"), "profile_id": "one", "num_steps": 4, **QUIET}
    second = {"output_dir": str(tmp_path / "e"), "profile_id": "two", "num_steps": 50, **QUIET}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        start = server.forward_steps
        assert await call(http, server, "/start_profile", first) == (200, STARTED)
        await complete(server, max_tokens=2)
        assert await call(http, server, "/start_profile", second) == (200, STARTED)
        await complete(server, max_tokens=4)  # the first target: 4 steps after the first start
        assert await call(http, server, "/stop_profile") == (500, "Internal Server Error")
    (trace,) = (tmp_path / "d").iterdir()
    assert not (tmp_path / "e").exists()
    assert trace.name == "one-TP-0.trace.json.gz"
    assert forward_step_numbers(trace) == [start + 3, start + 4]
    assert count_sglang_steps(trace) == 2


async def test_one_step_annotation_per_forward_pass(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
) -> None:
    out = tmp_path / "d"
    body = {"output_dir": str(out), "profile_id": "s", "num_steps": 5, **QUIET}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        assert await call(http, server, "/start_profile", body) == (200, STARTED)
        await complete(server, max_tokens=8, prompt="hi")
    trace = out / "s-TP-0.trace.json.gz"
    steps = [
        e
        for e in load_trace(trace)["traceEvents"]
        if e.get("cat") == "user_annotation" and str(e.get("name")).startswith("step[")
    ]
    assert [e["ph"] for e in steps] == ["X"] * 5
    names = [e["name"] for e in steps]
    assert re.fullmatch(r"step\[EXTEND bs=1 toks=\d+\]", names[0]), names
    assert names[1:] == ["step[DECODE bs=1]"] * 4
    assert count_sglang_steps(trace) == 5


async def test_profile_by_stage_writes_extend_and_decode_traces(
    reference_server: ReferenceFactory,
    http: aiohttp.ClientSession,
    complete: Complete,
    tmp_path: Path,
) -> None:
    out = tmp_path / "st"
    body = {"output_dir": str(out), "profile_id": "g", "profile_by_stage": True, "num_steps": 2}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        assert await call(http, server, "/start_profile", {**body, **QUIET}) == (200, STARTED)
        await complete(server, max_tokens=5)  # one prefill batch, then four decode batches
    assert forward_step_numbers(out / "g-TP-0-EXTEND.trace.json.gz") == [1]
    assert forward_step_numbers(out / "g-TP-0-DECODE.trace.json.gz") == [2, 3]


async def test_unusable_activities_record_nothing(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        body = {"activities": ["MEM", "NOPE"]}
        assert await call(http, server, "/start_profile", body) == (200, STARTED)
        assert await call(http, server, "/stop_profile") == (500, "Internal Server Error")


async def test_bad_start_body_is_400(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        status, _ = await call(http, server, "/start_profile", {"num_steps": "many"})
        assert status == 400


async def test_info_routes_and_forward_counter(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}}
        async with http.post(f"{server.url}/generate", json=body) as response:
            out = await response.json()
        assert len(out["text"]) == 4
        assert out["meta_info"]["completion_tokens"] == 4
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
        async with http.get(f"{server.url}/server_info") as response:
            assert (await response.json())["version"] == "0.5.23"
        async with http.get(f"{server.url}/metrics") as response:
            text = await response.text()
        # Observed on 0.5.23: forward passes by mode, no counter named for forward steps.
        assert 'sglang:cuda_graph_passes_total{model_name="reference",mode="prefill_none"} 1.0' in (
            text
        )
        assert 'sglang:cuda_graph_passes_total{model_name="reference",mode="decode_none"} 3.0' in (
            text
        )
        assert "num_forward_steps" not in text
        for path in ("/server_info", "/get_server_info"):
            async with http.get(f"{server.url}{path}") as response:
                assert response.status == 200
                assert (await response.json())["version"] == "0.5.23"
        async with http.get(f"{server.url}/version") as response:
            assert response.status == 404


async def test_start_answers_plain_text_and_a_stop_after_the_auto_stop_500(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, complete: Complete
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        async with http.post(f"{server.url}/start_profile", json={"num_steps": 2}) as response:
            assert response.status == 200
            assert response.content_type == "text/plain"
            assert await response.text() == STARTED
        await complete(server, max_tokens=4)
        for method in ("POST", "GET"):
            async with http.request(method, f"{server.url}/stop_profile") as response:
                assert response.status == 500
                assert response.content_type == "text/plain"
                assert await response.text() == "Internal Server Error"
