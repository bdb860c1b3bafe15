"""The HTTP client piece every server adapter shares: one session, auth, JSON, logging, errors.

Client code only: the adapters and ``servers/reference`` share protocol facts, not code.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
import yarl
from aiohttp.connector import Connection

from aprof import LimitsConfig, TimeoutsConfig

_BODY_SHOWN = 500
"""Characters of an error body kept in messages (servers may answer with whole pages)."""
_CHUNK = 64 * 1024
"""Bytes read from an answer at a time."""


class ServerError(Exception):
    """A server answered a request with a status outside 2xx (a redirect included)."""

    def __init__(
        self, method: str, url: str, status: int, body: str, location: str | None = None
    ) -> None:
        # All go into args so the error pickles (Ray ships exceptions between processes).
        super().__init__(method, url, status, body, location)
        self.method = method
        self.url = url
        self.status = status
        """The HTTP status code."""
        self.body = body
        """The response body as text."""
        self.location = location
        """Where a redirect pointed (credentials removed), ``None`` for other answers."""

    def __str__(self) -> str:
        text = f"{self.method} {self.url} answered {self.status}"
        if self.location is not None:
            text += f" (a redirect to {self.location[:_BODY_SHOWN]}, not followed)"
        body = " ".join(self.body.split())[:_BODY_SHOWN]
        return text + (f": {body}" if body else "")


class AnswerTooLargeError(Exception):
    """A server's answer was longer than ``limits.answer_bytes``: it was not read."""

    def __init__(self, method: str, url: str, status: int, limit: int) -> None:
        super().__init__(method, url, status, limit)  # pickles, as ServerError does
        self.method = method
        self.url = url
        self.status = status
        """The HTTP status code of the refused answer."""
        self.limit = limit

    def __str__(self) -> str:
        return (
            f"{self.method} {self.url} answered more than {self.limit} bytes (limits.answer_bytes)"
        )


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


@dataclass(frozen=True, slots=True)
class Response:
    """A 2xx answer, read in full."""

    status: int
    text: str


class ServerClient:
    """One aiohttp session to one server, held between ``open`` and ``aclose``.

    Sends ``Authorization: Bearer <api_key>`` on every request when a key is given, or HTTP
    Basic auth with the user and password of ``base_url``, which shows nowhere else: every
    URL this client logs or puts in an error (``base_url`` too) has them removed. Logs every
    answer with the server URL and replica.
    """

    def __init__(self, base_url: str, *, replica: int, api_key: str | None = None) -> None:
        url = yarl.URL(base_url)
        auth = aiohttp.BasicAuth.from_url(url)
        if auth is not None and api_key:
            raise ValueError("give the server's credentials either in its URL or as api_key")
        if auth is not None:
            base_url = str(url.with_user(None))
            self._headers = {"Authorization": auth.encode()}
        else:
            self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        """The server's URL without credentials."""
        self._session: aiohttp.ClientSession | None = None
        self._timeouts = TimeoutsConfig()
        self._limits = LimitsConfig()
        self._log = structlog.get_logger("servers").bind(server=self.base_url, replica=replica)

    @property
    def timeouts(self) -> TimeoutsConfig:
        """The bounds given to :meth:`open` (the config defaults before that)."""
        return self._timeouts

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Create the session; every connection attempt is bounded by ``timeouts.connect_s``,
        every answer by ``limits.answer_bytes`` (the config's default without ``limits``)."""
        self._timeouts = timeouts
        self._limits = limits or LimitsConfig()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                response_class=_Answer,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s),
            )

    async def aclose(self) -> None:
        """Close the session (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        timeout_s: float,
        json: Mapping[str, Any] | None = None,
        quiet: bool = False,
    ) -> Response:
        """Send one request and read the whole answer within ``timeout_s``.

        ``json`` is sent as the body with ``Content-Type: application/json``; ``quiet`` logs
        the answer at debug level (for polling). Redirects are not followed. Raises
        :class:`ServerError` for a non-2xx answer, :class:`AnswerTooLargeError` for one
        longer than ``limits.answer_bytes``, ``aiohttp.ClientError`` when the server cannot
        be reached or hangs up, ``TimeoutError`` after ``timeout_s``, and ``RuntimeError``
        before :meth:`open`.
        """
        if self._session is None:
            raise RuntimeError(f"{self.base_url}: call open() before sending requests")
        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self._timeouts.connect_s)
        began = time.perf_counter()
        try:
            async with self._session.request(
                method, url, json=json, timeout=timeout, allow_redirects=False
            ) as resp:
                status, location = resp.status, resp.headers.get("Location")
                data = await _read_at_most(resp, self._limits.answer_bytes)
                if data is None:
                    resp.close()  # the rest of the answer is in the connection: not used again
                    raise AnswerTooLargeError(method, url, status, self._limits.answer_bytes)
                text = data.decode(_charset(resp), errors="replace")
        except (aiohttp.ClientError, TimeoutError, AnswerTooLargeError) as exc:
            self._log.warning("server request failed", method=method, path=path, error=repr(exc))
            raise
        log = self._log.debug if quiet else self._log.info
        log(
            "server answered",
            method=method,
            path=path,
            status=status,
            ms=round((time.perf_counter() - began) * 1000, 1),
        )
        if not 200 <= status < 300:
            shown = None if location is None or not 300 <= status < 400 else _without_user(location)
            raise ServerError(method, url, status, text, shown)
        return Response(status, text)

    async def metric(self, name: str) -> int | None:
        """The total of metric ``name`` from ``GET /metrics`` (bounded by ``connect_s``),
        ``None`` if the server does not export it. Raises what :meth:`request` raises."""
        answer = await self.request(
            "GET", "/metrics", timeout_s=self._timeouts.connect_s, quiet=True
        )
        return metric_total(answer.text, name)

    async def metric_or_none(self, name: str) -> int | None:
        """:meth:`metric`, or ``None`` when it fails in any way (logged at debug level)."""
        try:
            return await self.metric(name)
        except Exception as exc:
            self._log.debug("metric unreadable", metric=name, error=repr(exc))
            return None

    async def get_json(self, path: str, *, timeout_s: float) -> Any:
        """``GET path`` and decode the JSON answer; raises ``ValueError`` if it is not JSON."""
        text = (await self.request("GET", path, timeout_s=timeout_s)).text
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.base_url}{path} did not answer JSON: {text[:100]!r}") from exc


async def _read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body of ``resp``, ``None`` as soon as it is known to be longer than ``limit``."""
    if resp.content_length is not None and resp.content_length > limit:
        return None
    body = bytearray()
    while chunk := await resp.content.read(_CHUNK):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _charset(resp: aiohttp.ClientResponse) -> str:
    """The answer's declared charset if Python knows it, else UTF-8."""
    try:
        return codecs.lookup(resp.charset or "utf-8").name
    except LookupError:
        return "utf-8"


def _without_user(url: str) -> str:
    """``url`` with any user and password removed."""
    try:
        parsed = yarl.URL(url)
        if parsed.user is None and parsed.password is None:
            return url
        return str(parsed.with_user(None))
    except ValueError:
        return "<a URL that cannot be parsed>"


def restart_error(at_start: int | None, at_stop: int | None) -> str | None:
    """The error of a window whose server restarted (its forward-step counter went back
    from ``at_start`` to ``at_stop``), ``None`` when the counter shows no restart."""
    if at_start is None or at_stop is None or at_stop >= at_start:
        return None
    return (
        f"the server restarted during the window (forward-step counter {at_start} at start, "
        f"{at_stop} at stop): its capture was lost"
    )


def metric_total(text: str, name: str) -> int | None:
    """The sum of every sample of metric ``name`` in Prometheus text, ``None`` if absent or
    not a finite number.

    Samples of one metric differ by labels (one per engine or model); a counter of engine
    steps is their sum.
    """
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", re.MULTILINE)
    values = []
    for match in pattern.finditer(text):
        try:
            values.append(float(match.group(1)))
        except ValueError:
            continue  # a malformed sample is not a count
    finite = [v for v in values if math.isfinite(v)]
    total = sum(finite)
    # Finite samples can still add up past the largest float.
    return int(total) if finite and math.isfinite(total) else None
