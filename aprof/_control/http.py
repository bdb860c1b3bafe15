"""The control endpoint: ``POST /capture`` and ``GET /status`` over HTTP on 127.0.0.1 only.

Every request bears ``Authorization: Bearer <token>``, the token read from
``control.http.token_file`` when the endpoint starts; one without it (or with another) is
answered 401 and reaches nothing of the run. A capture request's body is read up to
``MAX_REQUEST_BYTES`` within the endpoint's time bound and decided by the run at once:

- 200: accepted, with the :class:`CaptureAnswer`;
- 409: refused by the run (a step begun already, an unknown replica), with the answer;
- 400: not a capture request (not JSON, a bad field), with a refused answer saying why;
- 413: a body over ``MAX_REQUEST_BYTES``, unread; 408: a body that does not arrive in time;
- 401: no token or a wrong one; 500: a bug of aprof's, logged (it never reaches the run).

A server: it shares only the messages (``messages.py``, ``status.py``) with the clients.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from aprof._config import ControlHTTPConfig
from aprof._control.messages import (
    MAX_REQUEST_BYTES,
    REQUEST_ID,
    CaptureAnswer,
    CaptureRequest,
    bad_field,
    new_request_id,
    refusal,
)
from aprof._control.status import RunStatus
from aprof._errors import ConfigError, describe
from aprof._logging import logger
from aprof._safe_files import read_regular

HOST: Final = "127.0.0.1"
"""The only address the endpoint listens on."""
MAX_TOKEN_BYTES: Final = 4096
MIN_TOKEN_CHARS: Final = 16
_KEY: Final = "control.http.token_file"
_JSON: Final = "application/json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ControlEndpoint:
    """The run's HTTP control endpoint: capture requests decided by ``decide``, the status
    given by ``status``, both called on the event loop."""

    def __init__(
        self,
        config: ControlHTTPConfig,
        *,
        decide: Callable[[CaptureRequest], CaptureAnswer],
        status: Callable[[], RunStatus],
        timeout_s: float = 5.0,
    ) -> None:
        self._config = config
        self._decide = decide
        self._status = status
        self._timeout_s = timeout_s
        """Bounds reading the token file, reading one request's body, and closing."""
        self._token = b""
        self._runner: web.AppRunner | None = None
        self.address: str | None = None
        """``127.0.0.1:<port>`` while it listens."""

    async def start(self) -> str:
        """Read the token and listen on 127.0.0.1; returns ``127.0.0.1:<port>``.

        Raises ``ConfigError`` (``control.http.token_file``) when the token file cannot be
        read, is empty, holds a token of fewer than 16 characters or one a header cannot
        carry; ``OSError`` when the port cannot be bound (taken, not allowed).
        """
        if self._runner is not None:
            raise RuntimeError("the control endpoint is started once")
        self._token = await self._read_token()
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/capture", self._capture)
        app.router.add_get("/status", self._run_status, allow_head=False)
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self._timeout_s
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, HOST, self._config.port, reuse_port=False)
            await site.start()
            port = int(runner.addresses[0][1])
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.address = f"{HOST}:{port}"
        return self.address

    async def aclose(self) -> None:
        """Stop listening and end the requests under way (within the time bound)."""
        runner, self._runner = self._runner, None
        self.address = None
        if runner is None:
            return
        try:
            async with asyncio.timeout(2 * self._timeout_s + 1):
                await runner.cleanup()
        except TimeoutError:
            logger.warning("control endpoint did not close in time")

    async def _read_token(self) -> bytes:
        path = self._config.token_file
        try:
            async with asyncio.timeout(self._timeout_s):
                data = await asyncio.to_thread(read_regular, path, MAX_TOKEN_BYTES)
        except TimeoutError:
            raise ConfigError(_KEY, f"{path} could not be read in time") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(_KEY, f"cannot read {path}: {describe(exc)}") from None
        try:
            token = data.decode("ascii").strip()
        except UnicodeDecodeError:
            raise ConfigError(_KEY, f"{path} holds a token that is not ASCII") from None
        if not token:
            raise ConfigError(_KEY, f"{path} is empty")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                _KEY, f"the token in {path} is shorter than {MIN_TOKEN_CHARS} characters"
            )
        if not all(33 <= ord(c) <= 126 for c in token):
            raise ConfigError(_KEY, f"the token in {path} holds spaces or control characters")
        return token.encode("ascii")

    # -- requests ----------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """No token, no answer but 401; a bug of a handler answers 500, never escapes."""
        if not self._authorized(request):
            return _json(
                401,
                {"error": "a valid 'Authorization: Bearer <token>' header is required"},
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            return await handler(request)
        except web.HTTPException:
            raise  # aiohttp's own answers: 404, 405
        except Exception as exc:
            logger.exception(
                "control endpoint failed",
                method=request.method,
                path=request.path,
                error=describe(exc),
            )
            return _json(500, {"error": "internal error; see the run's log"})

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.strip().partition(" ")
        if scheme.lower() != "bearer":  # the scheme's case does not matter (RFC 9110)
            return False
        return hmac.compare_digest(given.strip().encode("utf-8", "replace"), self._token)

    async def _capture(self, request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            return _too_large()
        try:
            async with asyncio.timeout(self._timeout_s):
                body = await _read_bounded(request, MAX_REQUEST_BYTES)
        except TimeoutError:
            return _json(408, {"error": "the request's body did not arrive in time"})
        if body is None:
            return _too_large()
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
            return self._malformed(new_request_id(), "malformed request: not a JSON document")
        request_id = _id_of(data)
        try:
            capture = CaptureRequest.parse(data)
        except ConfigError as exc:
            return self._malformed(request_id, bad_field(exc))
        answer = self._decide(capture)
        status = 200 if answer.accepted else 409
        return _json_text(status, answer.model_dump_json(by_alias=True))

    def _malformed(self, request_id: str, reason: str) -> web.Response:
        logger.warning("capture refused", id=request_id, reason=reason, via="http")
        answer = refusal(request_id, reason)
        return _json_text(400, answer.model_dump_json(by_alias=True))

    async def _run_status(self, request: web.Request) -> web.StreamResponse:
        return _json_text(200, self._status().model_dump_json(by_alias=True))


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, or ``None`` once it passes ``limit`` bytes (the rest left unread)."""
    body = bytearray()
    while True:
        chunk = await request.content.read(limit + 1 - len(body))
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > limit:
            return None


def _id_of(data: object) -> str:
    """The id a malformed request is answered under: its own if it is a valid one."""
    if isinstance(data, dict):
        given = data.get("id")
        if isinstance(given, str) and REQUEST_ID.fullmatch(given):
            return given
    return new_request_id()


def _too_large() -> web.Response:
    return _json(413, {"error": f"a capture request is at most {MAX_REQUEST_BYTES} bytes"})


def _json(status: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return _json_text(status, json.dumps(data), headers)


def _json_text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, content_type=_JSON, headers=headers)
