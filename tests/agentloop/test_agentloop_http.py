"""The HTTP path LLMClient shares with the server adapters (``aprof._http``), against small
aiohttp apps on 127.0.0.1: answers bounded by ``max_answer_bytes`` (whole, chunked, streamed,
error pages), credentials in replica URLs sent but never shown, and a connect timeout that
covers the name lookup, the same for both clients. Nothing sleeps; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import aiohttp.connector
import pytest
from agentloop_replicas import serve_handler as serve
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

import aprof
from agentloop import LLMClient, LLMError
from aprof import UsageError, _http
from servers import VLLMServer
from servers.process import free_port

LIMIT_S = 30
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
COMPLETION = {"choices": [{"text": "ok", "finish_reason": "stop"}]}


def completion_of(chars: int) -> Handler:
    """A whole completion with a Content-Length, its text ``chars`` characters long."""

    async def answer(request: web.Request) -> web.StreamResponse:
        text = "x" * chars
        return web.json_response({"choices": [{"text": text, "finish_reason": "length"}]})

    return answer


async def chunked(request: web.Request) -> web.StreamResponse:
    """A whole completion without a Content-Length: 64 chunks of 1 KiB of JSON text."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    await response.write(b'{"choices": [{"text": "')
    for _ in range(64):
        await response.write(b"y" * 1024)
    await response.write(b'", "finish_reason": "length"}]}')
    await response.write_eof()
    return response


async def endless_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events of one character each, 4000 of them, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    event = b'data: {"choices": [{"text": "z", "finish_reason": null}]}\n\n'
    for _ in range(4000):
        await response.write(event)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def error_page(request: web.Request) -> web.StreamResponse:
    """A 500 whose page is 64 KiB long."""
    return web.Response(status=500, text="<html>" + "e" * 65536 + "</html>")


def test_the_default_limit_is_the_config_default() -> None:
    # One default for the adapters' limits.answer_bytes and the client's max_answer_bytes.
    assert aprof.LimitsConfig().answer_bytes == _http.ANSWER_BYTES
    default = inspect.signature(LLMClient).parameters["max_answer_bytes"].default
    assert default == aprof.LimitsConfig().answer_bytes


@pytest.mark.parametrize(
    ("handler", "stream"),
    [(completion_of(70_000), False), (chunked, False), (endless_stream, True)],
    ids=["content-length", "chunked", "stream"],
)
async def test_an_answer_over_max_answer_bytes_is_a_response_error(
    handler: Handler, stream: bool
) -> None:
    # The stream's events are ~60 bytes each: only their total passes the limit.
    async with (
        asyncio.timeout(LIMIT_S),
        serve(handler) as url,
        LLMClient([url], stream=stream, max_answer_bytes=32 * 1024) as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=1)
        assert not llm.balancer.avoided(0)  # the replica answered: it is up
    error = caught.value
    assert (error.kind, error.replica, error.status) == ("response", 0, None)
    assert "longer than 32768 bytes (max_answer_bytes)" in error.cause


async def test_an_answer_within_max_answer_bytes_is_read() -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        serve(completion_of(4000)) as url,
        LLMClient([url], max_answer_bytes=4096) as llm,
    ):
        out = await llm.generate("hi", max_tokens=1)
    assert (len(out.text), out.finish_reason) == (4000, "length")


async def test_an_error_page_over_max_answer_bytes_is_still_a_status_error() -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        serve(error_page) as url,
        LLMClient([url], max_answer_bytes=4096) as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=1)
    assert (caught.value.kind, caught.value.status) == ("status", 500)
    assert "longer than 4096 bytes" in caught.value.cause


async def test_a_redirect_is_a_status_error_and_is_not_followed() -> None:
    followed: list[str] = []

    async def moved(request: web.Request) -> web.StreamResponse:
        if request.path == "/elsewhere/v1/completions":
            followed.append(request.path)
            return web.json_response(COMPLETION)
        raise web.HTTPTemporaryRedirect("/elsewhere/v1/completions")

    async with asyncio.timeout(LIMIT_S), serve(moved) as url, LLMClient([url]) as llm:
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=1)
    assert (caught.value.kind, caught.value.status, followed) == ("status", 307, [])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16"])
def test_max_answer_bytes_is_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_answer_bytes"):
        LLMClient(["http://127.0.0.1:1"], max_answer_bytes=bad)


async def test_credentials_in_a_replica_url_are_sent_and_never_shown() -> None:
    expected = "Basic " + base64.b64encode(b"user:s3cret").decode()

    async def guarded(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != expected:
            return web.json_response({"error": "who are you"}, status=401)
        return web.json_response(COMPLETION)

    async with asyncio.timeout(LIMIT_S), serve(guarded) as url:
        right, wrong = (url.replace("//", f"//user:{word}@") for word in ("s3cret", "guess"))
        async with LLMClient([right, wrong]) as llm:
            assert (await llm.generate("hi", max_tokens=1, prefer=0)).text == "ok"
            with pytest.raises(LLMError) as refused:
                await llm.generate("hi", max_tokens=1, prefer=1)
    error = refused.value
    assert (error.kind, error.status, error.url) == ("status", 401, f"{url}/v1/completions")
    assert "guess" not in str(error) and "guess" not in repr(error.args)


async def test_a_refused_replica_url_with_credentials_is_shown_without_them() -> None:
    urls = [f"http://user:s3cret@127.0.0.1:{free_port()}"]
    async with asyncio.timeout(LIMIT_S), LLMClient(urls) as llm:
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=1)
    error = caught.value
    assert error.kind == "connect"
    assert error.url == urls[0].replace("user:s3cret@", "") + "/v1/completions"
    assert "s3cret" not in str(error) and "s3cret" not in repr(error.args)


def test_credentials_go_in_the_url_or_as_api_key_not_both() -> None:
    with pytest.raises(ValueError, match="either in their URLs or as api_key") as caught:
        LLMClient(["http://user:s3cret@127.0.0.1:1"], api_key="k")
    assert "s3cret" not in str(caught.value)


async def test_generate_outside_open_and_aclose_is_a_usage_error() -> None:
    llm = LLMClient(["http://127.0.0.1:1"])
    with pytest.raises(UsageError, match="open the LLMClient"):
        await llm.generate("hi", max_tokens=1)
    async with llm:
        pass
    with pytest.raises(UsageError):
        await llm.generate("hi", max_tokens=1)
    with pytest.raises(UsageError, match="no request in flight"):
        llm.balancer.release(0)
    assert issubclass(UsageError, RuntimeError) and issubclass(UsageError, aprof.AprofError)


# --- a name lookup that never answers --------------------------------------------------------


class SilentDNS(AbstractResolver):
    """A resolver that never answers: only a connect bound covering the lookup ends a request."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self._closed = asyncio.Event()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        await self._closed.wait()  # until the session closes
        raise OSError(f"{host}: no answer")

    async def close(self) -> None:
        self._closed.set()


@pytest.fixture
def silent_dns(monkeypatch: pytest.MonkeyPatch) -> SilentDNS:
    """Every aiohttp connector made from now on resolves names with one :class:`SilentDNS`."""
    resolver = SilentDNS()
    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", lambda **_: resolver)
    return resolver


async def test_llmclient_connect_timeout_covers_the_name_lookup(silent_dns: SilentDNS) -> None:
    # Were the lookup outside the connect bound, the request would end only by its timeout_s,
    # as a "timeout" that is never tried on another replica.
    urls = ["http://replica-a.invalid:8000", "http://replica-b.invalid:8000"]
    async with (
        asyncio.timeout(LIMIT_S),
        LLMClient(urls, connect_timeout_s=0.05, timeout_s=LIMIT_S) as llm,
    ):
        with pytest.raises(LLMError) as caught:
            await llm.generate("hi", max_tokens=1)
        assert llm.balancer.avoided(0) and llm.balancer.avoided(1)
    assert caught.value.kind == "connect"
    assert sorted(silent_dns.asked) == ["replica-a.invalid", "replica-b.invalid"]


async def test_adapter_connect_timeout_covers_the_name_lookup(silent_dns: SilentDNS) -> None:
    # The adapters bound every connection the same way: the version read at open fails as a
    # connection that could not be made, not at the end of timeouts.start_s.
    server = VLLMServer("http://vllm.invalid:8000", replica=0)
    timeouts = aprof.TimeoutsConfig(connect_s=0.05, start_s=LIMIT_S)
    async with asyncio.timeout(LIMIT_S):
        with pytest.raises(aiohttp.ConnectionTimeoutError):
            await server.open(timeouts)
    assert silent_dns.asked == ["vllm.invalid"]


async def test_llmclient_reads_an_empty_answer_as_a_response_error() -> None:
    async def empty(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"", content_type="application/json")

    async with asyncio.timeout(LIMIT_S), serve(empty) as url, LLMClient([url]) as llm:
        with pytest.raises(LLMError, match="not a JSON object") as caught:
            await llm.generate("hi", max_tokens=1)
    assert caught.value.kind == "response"


async def test_llmclient_decodes_an_answer_in_its_declared_charset() -> None:
    async def latin1(request: web.Request) -> web.StreamResponse:
        body = json.dumps(
            {"choices": [{"text": "café", "finish_reason": "stop"}]}, ensure_ascii=False
        )
        return web.Response(
            body=body.encode("latin-1"),
            headers={"Content-Type": "application/json; charset=latin-1"},
        )

    async with asyncio.timeout(LIMIT_S), serve(latin1) as url, LLMClient([url]) as llm:
        assert (await llm.generate("hi", max_tokens=1)).text == "café"
