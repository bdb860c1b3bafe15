"""The HTTP client path aprof's clients share: the server adapters (``servers``) and
``agentloop.LLMClient``.

One way to open a session, send a request and read its answer, so that both clients agree on
what a server is trusted with:

- the connect timeout covers the whole wait for a connection, the name lookup included;
- no redirect is followed: a 3xx is an answer like any other;
- no answer is read past a limit in bytes, whole or streamed; the connection of one that
  passes it is closed, not used again;
- no connection is used again after a non-2xx answer (a server that failed may drop it);
- an answer is decoded with the charset it declares (UTF-8 when it names none Python knows);
- the user and password of a URL can be removed before it is shown (:func:`without_user`).

What a request means (authentication, retries, logging, the errors a caller raises) stays with
the caller. Foundation: the standard library, aiohttp, yarl and ``aprof._errors`` only.
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import yarl
from aiohttp.connector import Connection

from aprof._errors import BodyTooLargeError

ANSWER_BYTES = 16 * 1024**2
"""The most bytes of an answer read by default (the default of ``limits.answer_bytes``)."""


class _Answer(aiohttp.ClientResponse):
    """A response whose connection is used again only after a 2xx answer."""

    async def start(self, connection: Connection) -> aiohttp.ClientResponse:
        protocol = connection.protocol
        await super().start(connection)
        if protocol is not None and not 200 <= self.status < 300:
            # A server that failed may drop the connection (SGLang does after a 500): the
            # next request sent on it would be reset.
            protocol.force_close()  # closed, not pooled, once the answer is read
            if connection.protocol is None:  # the answer was whole and already pooled
                protocol.close()
        return self


def client_timeout(connect_s: float, total_s: float | None = None) -> aiohttp.ClientTimeout:
    """The bounds of one request: ``connect_s`` on getting a connection, ``total_s`` (if
    given) on the whole exchange, the answer's last byte included."""
    # One bound for both clients, and this one: `connect` covers the whole wait for a
    # connection (a free one from the pool, the name lookup, the TCP connect), where
    # `sock_connect` covers the TCP connect alone. A name server that does not answer is a
    # connection that cannot be made; under `sock_connect` it would hold LLMClient's request
    # until `timeout_s` and fail it as a `timeout` (never tried on another replica), and an
    # adapter's start or stop for all of `start_s` / `stop_s`.
    return aiohttp.ClientTimeout(total=total_s, connect=connect_s)


def session(
    *, connect_s: float, headers: Mapping[str, str] | None = None, connections: int = 100
) -> aiohttp.ClientSession:
    """A session whose requests are bounded by ``connect_s`` on connecting (see
    :func:`client_timeout`), carry ``headers``, and never reuse a connection after a non-2xx
    answer. ``connections`` bounds the connections open at once (0: no bound). Call it
    inside the event loop that will use the session."""
    return aiohttp.ClientSession(
        headers=headers,
        response_class=_Answer,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=client_timeout(connect_s),
    )


def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    timeout: aiohttp.ClientTimeout,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
    """``method url`` on ``session`` within ``timeout``, following no redirect: use as
    ``async with send(...) as resp:``. ``json`` is sent as the body (``Content-Type:
    application/json``); ``headers`` are added to the session's."""
    return session.request(
        method, url, json=json, headers=headers, timeout=timeout, allow_redirects=False
    )


async def chunks(resp: aiohttp.ClientResponse, limit: int) -> AsyncGenerator[bytes, None]:
    """The body of ``resp`` as it arrives, at most ``limit`` bytes in all.

    Raises :class:`BodyTooLargeError`, closing ``resp``, before reading a body whose
    ``Content-Length`` is larger, and as soon as a body without one passes the limit.
    Stopped early, wrap it in ``contextlib.aclosing``.
    """
    if resp.content_length is not None and resp.content_length > limit:
        raise _too_large(resp, limit)
    read = 0
    async for chunk in resp.content.iter_any():
        read += len(chunk)
        if read > limit:
            raise _too_large(resp, limit)
        yield chunk


async def read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of ``resp``; raises :class:`BodyTooLargeError` as :func:`chunks` does."""
    return b"".join([chunk async for chunk in chunks(resp, limit)])


async def read_text(resp: aiohttp.ClientResponse, limit: int, *, errors: str = "replace") -> str:
    """The whole body of ``resp`` as text in its :func:`charset`; bytes that do not decode
    are replaced (``errors="strict"``: raise ``UnicodeDecodeError``, a ``ValueError``).
    Raises :class:`BodyTooLargeError` as :func:`chunks` does."""
    return (await read_body(resp, limit)).decode(charset(resp), errors)


def charset(resp: aiohttp.ClientResponse) -> str:
    """The answer's declared charset if Python knows it, else UTF-8."""
    try:
        return codecs.lookup(resp.charset or "utf-8").name
    except LookupError:
        return "utf-8"


def without_user(url: str) -> str:
    """``url`` with any user and password removed, to be shown in logs and errors."""
    try:
        parsed = yarl.URL(url)
        if parsed.user is None and parsed.password is None:
            return url
        return str(parsed.with_user(None))
    except ValueError:
        return "<a URL that cannot be parsed>"


def _too_large(resp: aiohttp.ClientResponse, limit: int) -> BodyTooLargeError:
    resp.close()  # the rest of the answer is in the connection: it is not used again
    return BodyTooLargeError(limit)
