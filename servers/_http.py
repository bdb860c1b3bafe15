"""The HTTP client piece every server adapter shares: one session, auth, JSON, logging, errors.

Client code only: the adapters and ``servers/reference`` share protocol facts, not code.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from aprof import LimitsConfig, TimeoutsConfig

_BODY_SHOWN = 500
"""Characters of an error body kept in messages (servers may answer with whole pages)."""


class ServerError(Exception):
    """A server answered a request with a status outside 2xx."""

    def __init__(self, method: str, url: str, status: int, body: str) -> None:
        # All four go into args so the error pickles (Ray ships exceptions between processes).
        super().__init__(method, url, status, body)
        self.method = method
        self.url = url
        self.status = status
        """The HTTP status code."""
        self.body = body
        """The response body as text."""

    def __str__(self) -> str:
        body = " ".join(self.body.split())[:_BODY_SHOWN]
        return f"{self.method} {self.url} answered {self.status}" + (f": {body}" if body else "")


@dataclass(frozen=True, slots=True)
class Response:
    """A 2xx answer, read in full."""

    status: int
    text: str


class ServerClient:
    """One aiohttp session to one server, held between ``open`` and ``aclose``.

    Sends ``Authorization: Bearer <api_key>`` on every request when a key is given and logs
    every answer with the server URL and replica.
    """

    def __init__(self, base_url: str, *, replica: int, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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
        the answer at debug level (for polling). Raises :class:`ServerError` for a non-2xx
        answer, ``aiohttp.ClientError`` when the server cannot be reached or hangs up,
        ``TimeoutError`` after ``timeout_s``, and ``RuntimeError`` before :meth:`open`.
        """
        if self._session is None:
            raise RuntimeError(f"{self.base_url}: call open() before sending requests")
        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=self._timeouts.connect_s)
        began = time.perf_counter()
        try:
            async with self._session.request(method, url, json=json, timeout=timeout) as resp:
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
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
            raise ServerError(method, url, status, text)
        return Response(status, text)

    async def metric(self, name: str) -> int | None:
        """The total of metric ``name`` from ``GET /metrics`` (bounded by ``connect_s``),
        ``None`` if the server does not export it. Raises what :meth:`request` raises."""
        answer = await self.request(
            "GET", "/metrics", timeout_s=self._timeouts.connect_s, quiet=True
        )
        return metric_total(answer.text, name)

    async def metric_or_none(self, name: str) -> int | None:
        """:meth:`metric`, or ``None`` when ``/metrics`` cannot be read either."""
        try:
            return await self.metric(name)
        except (aiohttp.ClientError, ServerError, TimeoutError) as exc:
            self._log.debug("metric unreadable", metric=name, error=repr(exc))
            return None

    async def get_json(self, path: str, *, timeout_s: float) -> Any:
        """``GET path`` and decode the JSON answer; raises ``ValueError`` if it is not JSON."""
        text = (await self.request("GET", path, timeout_s=timeout_s)).text
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.base_url}{path} did not answer JSON: {text[:100]!r}") from exc


def metric_total(text: str, name: str) -> int | None:
    """The sum of every sample of metric ``name`` in Prometheus text, ``None`` if absent.

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
    return int(sum(finite)) if finite else None
