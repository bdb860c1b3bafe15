"""What the run's HTTP servers share (``aprof/_http_server.py``): bodies inflated within a bound,
tokens read once for both servers, and a real server on 127.0.0.1 that cuts slow clients,
bounds its connections and never drains a body it did not read."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from aprof import ConfigError
from aprof._http_server import (
    BodyRefusedError,
    BoundedServer,
    inflate,
    load_token,
    read_body,
)

LIMIT_S = 10
"""Every wait of these tests is bounded by this."""
TOKEN = b"a-token-of-32-characters-0123456"


@given(st.binary(max_size=4096), st.sampled_from(["gzip", "deflate"]))
def test_what_is_compressed_inflates_back(data: bytes, encoding: str) -> None:
    sent = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    assert inflate(sent, encoding, 4096) == data
    assert inflate(data, "identity", 4096) == data


@given(st.integers(1, 1 << 16))
def test_past_the_limit_is_413_however_it_compresses(limit: int) -> None:
    with pytest.raises(BodyRefusedError) as caught:
        inflate(gzip.compress(b"\0" * (limit + 1)), "gzip", limit)
    assert caught.value.status == 413


def test_a_bomb_inflates_no_further_than_the_limit() -> None:
    bomb = _bomb(256 << 20)
    with pytest.raises(BodyRefusedError, match="at most 1024 bytes inflated") as caught:
        inflate(bomb, "gzip", 1024)
    assert caught.value.status == 413


@pytest.mark.parametrize(
    ("body", "encoding", "says"),
    [
        (b"not gzip at all", "gzip", "not a valid gzip stream"),
        (gzip.compress(b"x" * 100)[:-12], "gzip", "cut short"),
        (zlib.compress(b"x") + b"tail", "deflate", "data after the deflate stream"),
        (gzip.compress(b"") * 17, "gzip", "data after the gzip stream"),
        (b"", "gzip", "cut short"),
    ],
    ids=["garbage", "cut", "trailing", "too-many-members", "empty"],
)
def test_a_broken_stream_is_400(body: bytes, encoding: str, says: str) -> None:
    with pytest.raises(BodyRefusedError, match=says) as caught:
        inflate(body, encoding, 1 << 20)
    assert caught.value.status == 400


def test_gzip_members_one_after_another_are_one_body() -> None:
    assert inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 100) == b"abcd"


def test_a_token_is_read_and_checked_once_for_every_server(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN.decode()}\n")
    assert load_token(path, "otel.token_file") == TOKEN
    path.write_text("short")
    with pytest.raises(ConfigError) as caught:
        load_token(path, "otel.token_file")
    assert caught.value.key == "otel.token_file" and "shorter than 16" in caught.value.reason


# -- a real server -----------------------------------------------------------------------------


async def _echo(request: web.Request) -> web.Response:
    try:
        body, _ = await read_body(request, 1024, 0.5)
    except BodyRefusedError as exc:
        return web.Response(status=exc.status, text=str(exc))
    return web.Response(body=body)


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@pytest.fixture
async def server() -> AsyncIterator[BoundedServer]:
    """A server asking for ``TOKEN``: headers within 0.5 s, two connections at once."""
    bounded = BoundedServer(
        [web.post("/echo", _echo), web.get("/hello", _hello)],
        name="test server",
        token=TOKEN,
        answer=lambda status, text, headers: web.Response(status=status, text=text),
        header_s=0.5,
        max_connections=2,
        client_max_size=1024,
        shutdown_s=1.0,
    )
    _, port = await bounded.start("127.0.0.1", 0)
    bounded.port = port  # type: ignore[attr-defined]
    try:
        yield bounded
    finally:
        await bounded.aclose()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(server: BoundedServer) -> Conn:
    return await asyncio.open_connection("127.0.0.1", server.port)  # type: ignore[attr-defined]


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """All the server sends until it closes the connection (bounded)."""
    async with asyncio.timeout(LIMIT_S):
        return await reader.read()


def _head(path: str, *, token: bytes | None = TOKEN, extra: str = "") -> bytes:
    auth = "" if token is None else f"Authorization: Bearer {token.decode()}\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{extra}".encode()


async def test_a_request_without_the_token_is_closed_before_its_body(
    server: BoundedServer,
) -> None:
    """A gzip bomb's headers without the token: 401 and the connection closed, though not a
    byte of its body was sent."""
    reader, writer = await _connect(server)
    extra = "Content-Encoding: gzip\r\nContent-Length: 1000000\r\n\r\n"
    writer.write(_head("/echo", token=None, extra=extra))
    answer = await _closed(reader)
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"Connection: close" in answer
    assert server.counts.unauthorized == 1
    writer.close()


async def test_headers_that_trickle_are_cut_at_the_deadline(server: BoundedServer) -> None:
    reader, writer = await _connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHo")  # and nothing more
    assert await _closed(reader) == b""
    writer.close()


async def test_a_body_that_trickles_is_408_and_cut(server: BoundedServer) -> None:
    reader, writer = await _connect(server)
    writer.write(_head("/echo", extra="Content-Length: 100\r\n\r\n") + b"only part")
    answer = await _closed(reader)
    assert answer.startswith(b"HTTP/1.1 408")
    writer.close()


async def test_an_encoding_not_taken_is_415_unread(server: BoundedServer) -> None:
    reader, writer = await _connect(server)
    writer.write(_head("/echo", extra="Content-Encoding: br\r\nContent-Length: 10\r\n\r\n"))
    assert (await _closed(reader)).startswith(b"HTTP/1.1 415")
    writer.close()


async def test_one_connection_past_the_bound_is_closed_at_once(server: BoundedServer) -> None:
    """Two connections held (kept alive after an answer); the third is closed before it sends
    anything; once one of the two goes, a new one is served."""
    held = [await _connect(server) for _ in range(2)]
    for reader, writer in held:
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n" + _auth() + b"\r\n")
        async with asyncio.timeout(LIMIT_S):
            await reader.readuntil(b"hello")
    assert server.connections == 2
    reader, writer = await _connect(server)
    assert await _closed(reader) == b""
    assert server.counts.refused == 1
    writer.close()
    held[0][1].close()
    async with asyncio.timeout(LIMIT_S):
        while True:  # served again once the server has seen the close
            reader, writer = await _connect(server)
            try:
                writer.write(
                    b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + _auth() + b"\r\n"
                )
                answer = await _closed(reader)
            except ConnectionError:
                answer = b""  # refused: still at the bound
            writer.close()
            if answer:
                break
    assert answer.startswith(b"HTTP/1.1 200")
    held[1][1].close()


async def test_a_crowd_of_connects_is_taken_a_few_a_second_and_each_is_served() -> None:
    """Ten connections made at once to a server accepting two a second: accepting pauses
    until the next second (the others wait in the kernel's backlog), and all ten are
    answered."""
    slow = BoundedServer(
        [web.get("/hello", _hello)],
        name="test server",
        token=None,
        answer=lambda status, text, headers: web.Response(status=status, text=text),
        header_s=LIMIT_S,
        max_connections=100,
        client_max_size=1024,
        shutdown_s=1.0,
        accepts_per_s=2,
    )
    _, port = await slow.start("127.0.0.1", 0)
    try:
        crowd = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
        for _, writer in crowd:
            writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(3 * LIMIT_S):
            answers = await asyncio.gather(*(reader.read() for reader, _ in crowd))
        for _, writer in crowd:
            writer.close()
    finally:
        await slow.aclose()
    assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"hello") for a in answers)
    assert slow.counts.accepted == 10
    assert slow.counts.throttled >= 1


def _auth() -> bytes:
    return b"Authorization: Bearer " + TOKEN + b"\r\n"


def _bomb(size: int) -> bytes:
    """``size`` zero bytes gzip-compressed, built a MiB at a time (memory flat)."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    parts = [stream.compress(zeros) for _ in range(size >> 20)]
    return b"".join(parts) + stream.flush()
