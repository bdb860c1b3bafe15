"""LLMClient against reference servers on 127.0.0.1: both APIs, streaming, keys, failures."""

from __future__ import annotations

import asyncio
import pickle
import re
from collections.abc import Callable, Sequence

import pytest
from agentloop_replicas import ReplicaFactory, Stall, serve_handler
from aiohttp import web

import aprof
from agentloop import Api, LLMClient, LLMError
from aprof._timeline.recorder import span_id_of
from servers.process import free_port
from servers.reference import Faults
from servers.reference.tokenizer import decode

LIMIT_S = 30
DIALECTS = [("vllm", "openai"), ("sglang", "openai"), ("sglang", "sglang")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("dialect", "api"), DIALECTS)
async def test_completion_text_and_counts(
    replicas: ReplicaFactory, dialect: str, api: Api, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1, dialect=dialect) as [server],
        LLMClient([server.url], api=api, stream=stream, model="reference") as llm,
    ):
        out = await llm.generate("hello there", max_tokens=5, request_id="r-1")
    assert len(out.text) == 5  # one character per token in the reference vocabulary
    assert (out.completion_tokens, out.prompt_tokens) == (5, len("hello there"))
    assert out.finish_reason == "length"
    assert (out.replica, out.request_id, out.failed_over_from) == (0, "r-1", ())
    assert (out.step, out.gated, out.captured) == (None, False, False)  # no profiler
    assert server.received == ["r-1"]


async def test_each_request_carries_its_w3c_trace_context(
    replicas: ReplicaFactory, make_config: Callable[..., aprof.ProfilerConfig]
) -> None:
    """Through a profiler, every call sends the request's ``traceparent`` (one trace per
    step, the request's own span) and ``tracestate`` (its replica); without one, neither."""
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        aprof.Profiler(make_config()) as prof,
        LLMClient([server.url], prof=prof) as llm,
    ):
        for n in (1, 2):
            async with prof.step(n):
                await llm.generate("hi", max_tokens=1, request_id=f"s{n}")
        await llm.generate("hi", max_tokens=1, request_id="after")
    salt = prof.manifest.trace_salt
    assert salt is not None
    assert server.traceparents == [
        f"00-{salt}{1:016x}-{span_id_of('s1')}-01",
        f"00-{salt}{2:016x}-{span_id_of('s2')}-01",
        f"00-{salt}{'f' * 16}-{span_id_of('after')}-01",  # outside any step
    ]
    assert server.tracestates == ["aprof=r0"] * 3
    async with replicas(1) as [plain], LLMClient([plain.url]) as llm:
        await llm.generate("hi", max_tokens=1, request_id="r")
    assert (plain.received, plain.traceparents, plain.tracestates) == (["r"], [None], [None])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("dialect", "api"), DIALECTS)
async def test_token_id_prompt_completes_like_its_text(
    replicas: ReplicaFactory, dialect: str, api: Api, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1, dialect=dialect) as [server],
        LLMClient([server.url], api=api, stream=stream) as llm,
    ):
        out = await llm.generate([1, 2, 3], max_tokens=2)
        as_text = await llm.generate(decode([1, 2, 3]), max_tokens=2)
    assert (out.prompt_tokens, out.completion_tokens) == (3, 2)
    assert out.text == as_text.text and len(out.text) == 2


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([], "at least one token ID"),
        ((1, -1), "integers >= 0, got -1"),
        ([1, True], "integers >= 0, got True"),
        ([1, 2.0], "integers >= 0, got 2.0"),
        (["1"], "integers >= 0, got '1'"),
    ],
)
async def test_bad_token_id_prompts_are_refused_before_sending(
    prompt: Sequence[int], message: str
) -> None:
    async with LLMClient(["http://127.0.0.1:1"]) as llm:  # nothing listens there
        with pytest.raises(ValueError, match=re.escape(message)):
            await llm.generate(prompt, max_tokens=1)


@pytest.mark.parametrize("api", ["openai", "sglang"])
async def test_streamed_and_whole_answers_agree(replicas: ReplicaFactory, api: Api) -> None:
    # The tiny model is deterministic (greedy over fixed weights), so both must match.
    async with asyncio.timeout(LIMIT_S), replicas(1, dialect="sglang") as [server]:
        async with LLMClient([server.url], api=api) as whole:
            expected = await whole.generate("abc", max_tokens=6)
        async with LLMClient([server.url], api=api, stream=True) as llm:
            got = await llm.generate("abc", max_tokens=6)
    assert got.text == expected.text and got.completion_tokens == 6


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_api_key_is_sent_and_a_missing_one_is_refused(
    replicas: ReplicaFactory, dialect: str
) -> None:
    api: Api = "openai" if dialect == "vllm" else "sglang"
    async with asyncio.timeout(LIMIT_S), replicas(1, dialect=dialect, api_key="k3y") as [server]:
        async with LLMClient([server.url], api=api, api_key="k3y") as llm:
            assert (await llm.generate("hi", max_tokens=2)).completion_tokens == 2
        async with LLMClient([server.url], api=api) as llm:
            with pytest.raises(LLMError) as caught:
                await llm.generate("hi", max_tokens=2)
    assert (caught.value.kind, caught.value.status, caught.value.replica) == ("status", 401, 0)


async def test_error_answer_names_replica_url_and_cause(replicas: ReplicaFactory) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [a, b],
        LLMClient([a.url, b.url], model="no-such-model") as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=2, prefer=1)
    error = caught.value
    assert (error.replica, error.url, error.status) == (1, f"{b.url}/v1/completions", 404)
    assert "no-such-model" in error.cause and "no-such-model" in str(error)
    assert f"replica 1 ({b.url}/v1/completions)" in str(error)
    assert (len(a.received), len(b.received)) == (0, 1)  # an answered request is not re-sent
    again = pickle.loads(pickle.dumps(error))
    assert (again.replica, again.kind, again.status, str(again)) == (1, "status", 404, str(error))


async def test_server_error_is_not_retried_elsewhere(replicas: ReplicaFactory) -> None:
    failing = Faults(fail_routes=frozenset({"/v1/completions"}))
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1, faults=failing) as [bad],
        replicas(1) as [ok],
        LLMClient([bad.url, ok.url]) as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=2, prefer=0)
        assert not llm.balancer.avoided(0)  # a 500 says the replica is up
    assert (caught.value.kind, caught.value.status) == ("status", 500)
    assert (len(bad.received), len(ok.received)) == (1, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_timeout_fails_the_request_without_resending_it(
    replicas: ReplicaFactory, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [a, b],
        Stall(a),
        Stall(b),
        LLMClient([a.url, b.url], stream=stream, timeout_s=0.3) as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=2, request_id="slow")
        assert llm.balancer.in_flight == (0, 0)
    assert caught.value.kind == "timeout"
    assert "0.3 s" in caught.value.cause
    assert a.received + b.received == ["slow"]


async def test_refused_connection_fails_over_once_and_is_avoided(replicas: ReplicaFactory) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [live],
        LLMClient([dead, live.url], avoid_s=600) as llm,
    ):
        first = await llm.generate("hi", max_tokens=2, prefer=0, request_id="a")
        assert llm.balancer.avoided(0)
        second = await llm.generate("hi", max_tokens=2, request_id="b")
        sticky = await llm.generate("hi", max_tokens=2, prefer=0, request_id="c")
    assert (first.replica, first.failed_over_from) == (1, (0,))
    assert (second.replica, second.failed_over_from) == (1, ())
    assert (sticky.replica, sticky.failed_over_from) == (1, ())  # a down replica loses its turns
    assert live.received == ["a", "b", "c"]


async def test_every_replica_refusing_is_one_error() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    async with asyncio.timeout(LIMIT_S), LLMClient(urls) as llm:
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=2)
        assert llm.balancer.avoided(0) and llm.balancer.avoided(1)
        assert llm.balancer.in_flight == (0, 0)
    assert caught.value.kind == "connect"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_replica_going_down_mid_request_is_not_resent(
    replicas: ReplicaFactory, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [a, b],
        Stall(a) as stall,
        LLMClient([a.url, b.url], stream=stream) as llm,
    ):
        pending = asyncio.create_task(llm.generate("hi", max_tokens=2, prefer=0))
        await stall.entered.wait()  # the request is inside a's engine
        stopping = asyncio.create_task(a.stop())
        with pytest.raises(LLMError) as caught:
            await pending
        stall.release()  # the engine closes only once its forward pass may end
        await stopping
        assert llm.balancer.avoided(0)
        after = await llm.generate("hi", max_tokens=2)
    assert (caught.value.kind, caught.value.replica) == ("disconnected", 0)
    assert (len(a.received), len(b.received)) == (1, 1)
    assert (after.replica, after.failed_over_from) == (1, ())


async def test_malformed_answers_are_response_errors() -> None:
    # A misbehaving proxy in front of a replica: a real HTTP server on 127.0.0.1.
    async def broken(request: web.Request) -> web.StreamResponse:
        if request.path == "/generate":
            return web.json_response({"no_text": True})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": "x", "finish_reason": null}]}\n\n')
        await response.write_eof()  # no [DONE]
        return response

    async with asyncio.timeout(LIMIT_S), serve_handler(broken) as url:
        async with LLMClient([url], api="sglang") as llm:
            with pytest.raises(LLMError, match="no 'text' string") as whole:
                await llm.generate("hi", max_tokens=2)
        async with LLMClient([url], stream=True) as llm:
            with pytest.raises(LLMError, match=r"without \[DONE\]") as streamed:
                await llm.generate("hi", max_tokens=2)
    assert whole.value.kind == streamed.value.kind == "response"


async def test_generate_needs_an_open_client_and_sane_arguments() -> None:
    llm = LLMClient(["http://127.0.0.1:1"])
    with pytest.raises(RuntimeError, match="open the LLMClient"):
        await llm.generate("hi", max_tokens=1)
    with pytest.raises(ValueError, match="replicas"):
        LLMClient([])
    with pytest.raises(ValueError, match="timeout_s"):
        LLMClient(["http://x"], timeout_s=0)
    for bad in ("127.0.0.1:8000", "http://"):  # no scheme; no host
        with pytest.raises(ValueError, match="http"):
            LLMClient([bad])
    with pytest.raises(ValueError, match="api"):
        LLMClient(["http://x"], api="grpc")  # type: ignore[arg-type]
    async with llm:
        with pytest.raises(ValueError, match="max_tokens"):
            await llm.generate("hi", max_tokens=0)
