"""What the run's HTTP servers share (the control endpoint, the OTLP receiver): an aiohttp
application served inside the training process with its clients bounded.

:class:`BoundedServer` accepts connections itself, so that neither a crowd nor a shortage of
file descriptors reaches the run:

- at most ``max_connections`` open at once; one more is accepted and closed at once (its
  descriptor is back before the next accept), so the process keeps its descriptors for the
  manifest whatever the number of clients;
- a connection's request line and headers arrive within ``header_s`` of its opening (or of
  its previous answer), or it is cut (aiohttp's keep-alive deadline, which a half-sent request
  does not reset);
- at most ``accepts_per_s`` connections are accepted a second (served or closed at once): a
  flood of connections waits in the kernel's backlog, not on the run's CPU;
- an accept that fails for want of descriptors or memory pauses accepting for a second,
  logged once per outage (not once per attempt), and said again when it accepts again;
- a token, when given, is checked on the headers: without it, 401 and the connection closed,
  the body never read;
- aiohttp neither inflates bodies (``auto_decompress`` off: a gzip bomb would be inflated on
  the event loop as it arrives) nor drains an unread one after the answer (no lingering):
  a request whose body was not read is answered and its connection closed.

A handler reads its body with :func:`read_body` (bounded in bytes and time, the encoding
checked first) and inflates it with :func:`inflate` on a thread, bounded in bytes.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import socket
import zlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Final

from aiohttp import hdrs, web

from aprof._errors import AprofError, ConfigError, describe
from aprof._logging import logger
from aprof._safe_files import read_regular

MAX_TOKEN_BYTES: Final = 4096
MIN_TOKEN_CHARS: Final = 16
ENCODINGS: Final = ("identity", "gzip", "deflate")
"""The content codings a body may come in (one, at most)."""
MAX_MEMBERS: Final = 16
"""gzip members one body may hold (RFC 1952 allows several; exporters send one)."""
ACCEPT_BATCH: Final = 32
"""Connections accepted per wake-up of the listening socket: the event loop is never held
long by a flood of connects."""
ACCEPT_RETRY_S: Final = 1.0
"""How long accepting pauses after it failed for want of descriptors or memory."""
ACCEPTS_PER_S: Final = 256
"""Connections accepted a second at most, by default: far above what OTLP exporters (a few
kept-alive connections) and ``aprof capture`` open, far below what a connect loop makes."""
BACKLOG: Final = 128
_QUIET: Final = logging.Logger("aprof.http_server", logging.CRITICAL + 1)
"""aiohttp's server logs each malformed request with its traceback: a client could fill the
run's log. Such a request is answered 400, which says all there is to say."""
_OUT_OF: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Answer = Callable[[int, str, "dict[str, str] | None"], web.Response]
"""Makes a server's answer: (status, text, headers)."""


class BodyRefusedError(AprofError, ValueError):
    """A request's body the server does not take: ``status`` is the HTTP answer (408, 413,
    415, 400), the message says why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


# -- tokens --------------------------------------------------------------------------------


def load_token(path: Path, key: str) -> bytes:
    """The token in the file at ``path`` (blocking: call it off the event loop).

    Raises ``ConfigError`` at ``key`` when the file cannot be read (missing, not a regular
    file, a link, over 4 KiB), is empty, or holds a token of fewer than 16 characters or one
    a header cannot carry (not ASCII, spaces, control characters).
    """
    try:
        data = read_regular(path, MAX_TOKEN_BYTES)
    except (OSError, ValueError) as exc:
        raise ConfigError(key, f"cannot read {path}: {describe(exc)}") from None
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path} holds a token that is not ASCII") from None
    if not token:
        raise ConfigError(key, f"{path} is empty")
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(key, f"the token in {path} is shorter than {MIN_TOKEN_CHARS} characters")
    if not all(33 <= ord(c) <= 126 for c in token):
        raise ConfigError(key, f"the token in {path} holds spaces or control characters")
    return token.encode("ascii")


async def read_token(path: Path, key: str, timeout_s: float) -> bytes:
    """:func:`load_token` on a thread, within ``timeout_s``; raises ``ConfigError`` at ``key``
    as it does, and when the file could not be read in time."""
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.to_thread(load_token, path, key)
    except TimeoutError:
        raise ConfigError(key, f"{path} could not be read in time") from None


def authorized(request: web.Request, token: bytes) -> bool:
    """Whether ``request`` bears ``Authorization: Bearer <token>`` (the scheme's case does not
    matter, RFC 9110); compared in constant time."""
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), token)


# -- bodies ---------------------------------------------------------------------------------


def encoding_of(request: web.Request) -> str:
    """The body's content coding, one of ``ENCODINGS``; ``BodyRefusedError`` (415) for another
    or for more than one."""
    given = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower() or "identity"
    if given not in ENCODINGS:
        raise BodyRefusedError(415, f"content encoding {given[:64]!r}: send gzip, deflate or none")
    return given


async def read_body(request: web.Request, limit: int, timeout_s: float) -> tuple[bytes, str]:
    """The body as sent and its coding (:func:`encoding_of`), read within ``timeout_s``.

    Raises ``BodyRefusedError``: 415 for an encoding not taken and 413 for a declared length
    over ``limit``, both before a byte is read; 413 once more than ``limit`` bytes came (read
    no further); 408 when the body did not arrive in time.
    """
    encoding = encoding_of(request)
    if request.content_length is not None and request.content_length > limit:
        raise BodyRefusedError(413, f"a body is at most {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                chunk = await request.content.read(limit + 1 - len(body))
                if not chunk:
                    return bytes(body), encoding
                body += chunk
                if len(body) > limit:
                    raise BodyRefusedError(413, f"a body is at most {limit} bytes")
    except TimeoutError:
        raise BodyRefusedError(408, f"the body did not arrive within {timeout_s:g}s") from None


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from ``encoding`` (one of ``ENCODINGS``), at most ``limit`` bytes
    inflated whatever it says (CPU-bound: call it off the event loop).

    Raises ``BodyRefusedError``: 413 when it inflates past ``limit``, 400 when it is not a
    valid stream of its coding.
    """
    if encoding == "identity":
        return body
    # gzip may hold several members one after another (RFC 1952); deflate is zlib's format.
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    out = bytearray()
    rest = body
    try:
        for _ in range(MAX_MEMBERS if encoding == "gzip" else 1):
            stream = zlib.decompressobj(wbits)
            out += stream.decompress(rest, limit + 1 - len(out))
            if len(out) > limit:
                raise BodyRefusedError(413, f"a body is at most {limit} bytes inflated")
            if not stream.eof:
                raise BodyRefusedError(400, f"the {encoding} stream is cut short")
            rest = stream.unused_data
            if not rest:
                return bytes(out)
    except zlib.error as exc:
        raise BodyRefusedError(400, f"not a valid {encoding} stream: {exc}") from None
    raise BodyRefusedError(400, f"data after the {encoding} stream ends")


# -- the server -----------------------------------------------------------------------------


class ServerCounts:
    """What a server did with its connections (written and read on the event loop)."""

    __slots__ = ("accepted", "failed", "outages", "refused", "throttled", "unauthorized")

    def __init__(self) -> None:
        self.accepted = 0
        """Connections served."""
        self.refused = 0
        """Connections closed as soon as accepted: ``max_connections`` were open."""
        self.unauthorized = 0
        """Requests answered 401."""
        self.failed = 0
        """Accepts that failed (each pauses accepting for ``ACCEPT_RETRY_S``)."""
        self.outages = 0
        """Runs of failed accepts, each logged once."""
        self.throttled = 0
        """Times accepting paused until the next second: ``accepts_per_s`` were accepted."""


class BoundedServer:
    """An aiohttp application on one address, its clients bounded (see the module).

    ``name`` names it in the log; ``token`` (``None``: none asked) guards every route;
    ``answer(status, text, headers)`` makes its own answers: 401, and 500 for a bug of a
    handler (logged, never raised); ``accepts_per_s`` bounds the connections accepted a
    second.
    """

    def __init__(
        self,
        routes: Iterable[web.RouteDef],
        *,
        name: str,
        token: bytes | None,
        answer: Answer,
        header_s: float,
        max_connections: int,
        client_max_size: int,
        shutdown_s: float,
        accepts_per_s: int = ACCEPTS_PER_S,
    ) -> None:
        self.name = name
        self.counts = ServerCounts()
        self._token = token
        self._answer = answer
        self._max_connections = max_connections
        self._accepts_per_s = accepts_per_s
        self._second_ends = 0.0
        self._accepted_this_second = 0
        self._shutdown_s = shutdown_s
        self._app = web.Application(middlewares=[self._guard], client_max_size=client_max_size)
        self._app.add_routes(routes)
        self._runner = web.AppRunner(
            self._app,
            handle_signals=False,
            shutdown_timeout=shutdown_s,
            access_log=None,
            keepalive_timeout=header_s,  # from the connection's opening, and between requests
            lingering_time=0,  # an unread body is not drained: the connection is closed
            auto_decompress=False,  # inflating is the handler's, bounded, off the event loop
            logger=_QUIET,
        )
        self._socket: socket.socket | None = None
        self._handing = 0
        """Connections accepted and not yet known to aiohttp's server."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry: asyncio.TimerHandle | None = None
        """Accepting resumes after a failed accept (an outage under way)."""
        self._throttle: asyncio.TimerHandle | None = None
        """Accepting resumes next second."""

    @property
    def connections(self) -> int:
        """Connections open now."""
        server = self._runner.server
        return self._handing + (0 if server is None else len(server.connections))

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on the first address ``host`` resolves to; returns the (host, port) bound.
        Raises ``OSError`` when it cannot be resolved or bound."""
        if self._socket is not None:
            raise RuntimeError(f"the {self.name} is started once")
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        if not infos:
            raise OSError(f"{host} resolves to no address")
        family, _, _, _, address = infos[0]
        await self._runner.setup()
        try:
            sock = socket.create_server(address, family=family, backlog=BACKLOG)
        except BaseException:
            await self._runner.cleanup()
            raise
        sock.setblocking(False)
        self._socket = sock
        loop.add_reader(sock.fileno(), self._accept)
        bound = sock.getsockname()
        return str(bound[0]), int(bound[1])

    async def aclose(self) -> None:
        """Stop accepting, then end the connections (the requests under way get
        ``shutdown_s`` to finish)."""
        sock, self._socket = self._socket, None
        for timer in (self._retry, self._throttle):
            if timer is not None:
                timer.cancel()
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        for task in list(self._tasks):
            task.cancel()
        try:
            async with asyncio.timeout(2 * self._shutdown_s + 1):
                await self._runner.cleanup()
        except TimeoutError:
            logger.warning("http server did not close in time", server=self.name)

    # -- accepting ---------------------------------------------------------------------------

    def _accept(self) -> None:
        sock = self._socket
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            now = loop.time()
            if now >= self._second_ends:
                self._second_ends, self._accepted_this_second = now + 1.0, 0
            if self._accepted_this_second >= self._accepts_per_s:
                self.counts.throttled += 1
                loop.remove_reader(sock.fileno())
                self._throttle = loop.call_at(self._second_ends, self._resume)
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._pause(exc)
                return
            self._accepted_this_second += 1
            if self._retry is not None:
                self._retry = None
                logger.info("http server accepts again", server=self.name)
            if self.connections >= self._max_connections:
                self.counts.refused += 1
                conn.close()
                continue
            self.counts.accepted += 1
            self._handing += 1
            task = loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _pause(self, exc: OSError) -> None:
        """Stop watching the listening socket for ``ACCEPT_RETRY_S``; the first failure of an
        outage is logged, the retries are not."""
        sock = self._socket
        assert sock is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        self.counts.failed += 1
        if self._retry is None:
            self.counts.outages += 1
            why = "out of file descriptors or memory" if exc.errno in _OUT_OF else "accept failed"
            logger.warning(
                "http server cannot accept", server=self.name, error=describe(exc), why=why
            )
        self._retry = loop.call_later(ACCEPT_RETRY_S, self._resume)

    def _resume(self) -> None:
        sock = self._socket
        if sock is not None:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)

    async def _serve(self, conn: socket.socket) -> None:
        server = self._runner.server
        try:
            if server is None:
                conn.close()
                return
            await asyncio.get_running_loop().connect_accepted_socket(server, conn)
        except BaseException as exc:
            conn.close()
            if not isinstance(exc, Exception):
                raise  # cancelled: the server closes
            # The peer went away before it was served.
            logger.debug("http connection not served", server=self.name, error=describe(exc))
        finally:
            self._handing -= 1

    # -- requests -----------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """No token, 401; a bug, 500; a body left unread closes the connection with the
        answer."""
        response: web.StreamResponse
        if self._token is not None and not authorized(request, self._token):
            self.counts.unauthorized += 1
            response = self._answer(
                401,
                "a valid 'Authorization: Bearer <token>' header is required",
                {"WWW-Authenticate": "Bearer"},
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException:
                raise  # aiohttp's own answers: 404, 405
            except Exception as exc:
                logger.exception(
                    f"{self.name} failed",
                    method=request.method,
                    path=request.path,
                    error=describe(exc),
                )
                response = self._answer(500, "internal error; see the run's log", None)
        if not request.content.is_eof():
            response.force_close()  # aiohttp closes it anyway (no lingering): say so
        return response
