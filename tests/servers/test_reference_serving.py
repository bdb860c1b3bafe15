"""The reference server as an inference server: completions, batching, auth and faults."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import aiohttp
import pytest

from servers.reference import Faults
from servers.reference.engine import StepInfo
from servers.reference.state import STATE

if TYPE_CHECKING:
    # For annotations only: at run time the name `conftest` may mean tests/conftest.py.
    from conftest import Complete, ReferenceFactory


async def test_completion_is_deterministic_and_counts_tokens(
    reference_server: ReferenceFactory, complete: Complete
) -> None:
    async with asyncio.timeout(30), reference_server(seed=3) as server:
        first = await complete(server, max_tokens=6, prompt="hi there")
        second = await complete(server, max_tokens=6, prompt="hi there")
    assert first["object"] == "text_completion"
    assert first["model"] == "reference"
    (choice,) = first["choices"]
    assert len(choice["text"]) == 6
    assert choice["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 8, "total_tokens": 14, "completion_tokens": 6}
    assert second["choices"][0]["text"] == choice["text"]


async def test_streaming_completion_sends_sse_and_done(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    body = {
        "model": "reference",
        "prompt": ["a", "b"],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        asyncio.timeout(30),
        reference_server() as server,
        http.post(f"{server.url}/v1/completions", json=body) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        raw = await response.text()
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in raw.split("\n\n") if line)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage = chunks.pop()
    assert usage["usage"]["completion_tokens"] == 6
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert len(mine) == 3
        assert [c["finish_reason"] for c in mine] == [None, None, "length"]


async def test_unknown_model_is_refused_like_vllm(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(model_name="tiny") as server:
        body = {"model": "gpt-x", "prompt": "hi", "max_tokens": 2}
        async with http.post(f"{server.url}/v1/completions", json=body) as response:
            assert response.status == 404
            assert await response.json() == {
                "error": {
                    "message": "The model `gpt-x` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            }
        async with http.get(f"{server.url}/v1/models") as response:
            assert [m["id"] for m in (await response.json())["data"]] == ["tiny"]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi", "max_tokens": 0},
        {"prompt": "", "max_tokens": 2},
        {"prompt": "x" * 600, "max_tokens": 2},
        {"max_tokens": 2},
        [1, 2],
        {"prompt": "hi", "stream": True, "stream_options": "usage"},
    ],
)
async def test_bad_completion_requests_are_400(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, body: object
) -> None:
    async with (
        asyncio.timeout(30),
        reference_server() as server,
        http.post(f"{server.url}/v1/completions", json=body) as response,
    ):
        assert response.status == 400
        assert (await response.json())["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize(("dialect", "iterations"), [("vllm", 8), ("sglang", 9)])
async def test_requests_share_iterations(
    reference_server: ReferenceFactory, dialect: str, iterations: int
) -> None:
    """Continuous batching: three 8-token requests and a 7-token one that joins after the
    first iteration take 8 iterations, not 31; SGLang runs the late prefill as a batch of its
    own, so 9."""
    async with asyncio.timeout(30), reference_server(dialect=dialect) as server:
        engine = server.app[STATE].engine
        seqs = [engine.submit([1, 2, 3], 8) for _ in range(3)]

        def join_late(info: StepInfo) -> None:
            # Runs after iteration 1, before iteration 2 is scheduled.
            if info.number == 1:
                seqs.append(engine.submit([4, 5], 7))

        engine.step_listeners.append(join_late)
        for seq in list(seqs):
            async for _ in seq.tokens():
                pass
        async for _ in seqs[-1].tokens():
            pass
        assert [len(seq.output) for seq in seqs] == [8, 8, 8, 7]
        assert server.forward_steps == iterations


async def test_vllm_api_key_guards_only_v1_routes(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(api_key="k") as server:
        body = {"prompt": "hi", "max_tokens": 1}
        async with http.post(f"{server.url}/v1/completions", json=body) as response:
            assert (response.status, await response.json()) == (401, {"error": "Unauthorized"})
        headers = {"Authorization": "Bearer k"}
        async with http.post(f"{server.url}/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
        for path in ("/start_profile", "/stop_profile"):  # as on vLLM: not protected
            async with http.post(f"{server.url}{path}") as response:
                assert response.status == 200
        async with http.get(f"{server.url}/health") as response:
            assert response.status == 200


async def test_sglang_api_key_guards_profile_routes(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang", api_key="k") as server:
        for path in ("/start_profile", "/generate", "/server_info"):
            async with http.post(f"{server.url}{path}") as response:
                assert response.status == 401
        async with http.get(f"{server.url}/health") as response:
            assert response.status == 200
        headers = {"Authorization": "Bearer k"}
        async with http.post(f"{server.url}/start_profile", headers=headers) as response:
            assert response.status == 200
        async with http.post(f"{server.url}/stop_profile", headers=headers) as response:
            assert response.status == 200


async def test_failing_routes_answer_500(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    faults = Faults(fail_routes=frozenset({"/start_profile"}), start_delay_s=0.01)
    async with asyncio.timeout(30), reference_server(faults=faults) as server:
        async with http.post(f"{server.url}/start_profile") as response:
            assert (response.status, await response.text()) == (500, "Internal Server Error")
        async with http.post(f"{server.url}/stop_profile") as response:
            assert response.status == 200


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_hanging_stop_blocks_nothing_else(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, dialect: str
) -> None:
    faults = Faults(hang_stop=True, start_delay_s=0.01, stop_delay_s=0.01)
    async with asyncio.timeout(30):
        async with reference_server(dialect=dialect, faults=faults) as server:
            async with http.post(f"{server.url}/start_profile") as response:
                assert response.status == 200
            stop = asyncio.create_task(http.post(f"{server.url}/stop_profile"))
            async with http.get(f"{server.url}/health") as response:
                assert response.status == 200
            body = {"model": "reference", "prompt": "hi", "max_tokens": 2}
            async with http.post(f"{server.url}/v1/completions", json=body) as response:
                assert response.status == 200
            assert not stop.done()
        # Shutting the server down ends the hanging request.
        with pytest.raises(aiohttp.ClientError):
            response = await stop
            response.raise_for_status()
