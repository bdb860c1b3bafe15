"""The control endpoint: ``POST /capture`` and ``GET /status`` over HTTP on 127.0.0.1 only.

Every request bears ``Authorization: Bearer <token>``, the token read from
``control.http.token_file`` when the endpoint starts; one without it (or with another) is
answered 401 on its headers, its body never read, and reaches nothing of the run. A capture
request's body (gzip or deflate taken, inflated on a thread) is read up to
``MAX_REQUEST_BYTES`` within ``control.http.body_s`` and decided by the run at once:

- 200: accepted, with the :class:`CaptureAnswer`;
- 409: refused by the run (a step begun already, an unknown replica), with the answer;
- 400: not a capture request (not JSON, a bad field, a broken gzip stream), with a refused
  answer saying why;
- 413: a body over ``MAX_REQUEST_BYTES``, sent or inflated, read no further; 415: another
  content coding; 408: a body that does not arrive in time;
- 401: no token or a wrong one; 500: a bug of aprof's, logged (it never reaches the run).

The connections are bounded as every server of the run's is (``aprof/_http_server.py``):
their number, the time their headers take, descriptors running out.

A server: it shares only the messages (``messages.py``, ``status.py``) with the clients.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
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
from aprof._errors import ConfigError
from aprof._http_server import (
    BodyRefusedError,
    BoundedServer,
    inflate,
    read_body,
    read_token,
)
from aprof._logging import logger

HOST: Final = "127.0.0.1"
"""The only address the endpoint listens on."""
_KEY: Final = "control.http.token_file"
_JSON: Final = "application/json"


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
        """Bounds reading the token file, and the requests under way as it closes."""
        self._server: BoundedServer | None = None
        self.address: str | None = None
        """``127.0.0.1:<port>`` while it listens."""

    async def start(self) -> str:
        """Read the token and listen on 127.0.0.1; returns ``127.0.0.1:<port>``.

        Raises ``ConfigError`` (``control.http.token_file``) when the token file cannot be
        read, is empty, holds a token of fewer than 16 characters or one a header cannot
        carry; ``OSError`` when the port cannot be bound (taken, not allowed).
        """
        if self._server is not None:
            raise RuntimeError("the control endpoint is started once")
        token = await read_token(self._config.token_file, _KEY, self._timeout_s)
        server = BoundedServer(
            [
                web.post("/capture", self._capture),
                web.get("/status", self._run_status, allow_head=False),
            ],
            name="control endpoint",
            token=token,
            answer=_answer,
            header_s=self._config.header_s,
            max_connections=self._config.max_connections,
            client_max_size=MAX_REQUEST_BYTES,
            shutdown_s=self._timeout_s,
        )
        _, port = await server.start(HOST, self._config.port)
        self._server = server
        self.address = f"{HOST}:{port}"
        return self.address

    async def aclose(self) -> None:
        """Stop listening and end the requests under way (within the time bound)."""
        server, self._server = self._server, None
        self.address = None
        if server is not None:
            await server.aclose()

    # -- requests ----------------------------------------------------------------------------

    async def _capture(self, request: web.Request) -> web.StreamResponse:
        try:
            sent, encoding = await read_body(request, MAX_REQUEST_BYTES, self._config.body_s)
            if encoding != "identity":
                sent = await asyncio.to_thread(inflate, sent, encoding, MAX_REQUEST_BYTES)
        except BodyRefusedError as exc:
            if exc.status == 400:
                return self._malformed(new_request_id(), f"malformed request: {exc}")
            return _answer(exc.status, str(exc), None)
        try:
            data = json.loads(sent)
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


def _id_of(data: object) -> str:
    """The id a malformed request is answered under: its own if it is a valid one."""
    if isinstance(data, dict):
        given = data.get("id")
        if isinstance(given, str) and REQUEST_ID.fullmatch(given):
            return given
    return new_request_id()


def _answer(status: int, text: str, headers: dict[str, str] | None) -> web.Response:
    return _json(status, {"error": text}, headers)


def _json(status: int, data: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return _json_text(status, json.dumps(data), headers)


def _json_text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, content_type=_JSON, headers=headers)
