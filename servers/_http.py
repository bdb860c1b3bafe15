"""One server's HTTP client, over aprof's shared client path (``aprof._http``): auth, logging
per server, the adapters' errors, and reading the forward counter from ``/metrics``.

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
import yarl

from aprof import LimitsConfig, TimeoutsConfig, UsageError, _http
from aprof._errors import BodyTooLargeError
from servers._errors import AnswerTooLargeError, ServerError, VersionError
from servers.versions import Version, parse_version


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
    answer with the server URL and replica. What the session trusts a server with (no
    redirect followed, bounded answers, no connection reused after a failure) is
    ``aprof._http``'s.
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
        """Create the session; every connection attempt, name lookup included, is bounded by
        ``timeouts.connect_s``, every answer by ``limits.answer_bytes`` (the config's default
        without ``limits``)."""
        self._timeouts = timeouts
        self._limits = limits or LimitsConfig()
        if self._session is None:
            self._session = _http.session(connect_s=timeouts.connect_s, headers=self._headers)

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
        be reached or hangs up (``aiohttp.ConnectionTimeoutError``, also a ``TimeoutError``,
        when no connection is made within ``timeouts.connect_s``), ``TimeoutError`` after
        ``timeout_s``, and :class:`aprof.UsageError` before :meth:`open`.
        """
        if self._session is None:
            raise UsageError(f"{self.base_url}: call open() before sending requests")
        url = self.base_url + path
        limit = self._limits.answer_bytes
        bounds = _http.client_timeout(self._timeouts.connect_s, total_s=timeout_s)
        began = time.perf_counter()
        try:
            async with _http.send(self._session, method, url, json=json, timeout=bounds) as resp:
                status, location = resp.status, resp.headers.get("Location")
                try:
                    text = await _http.read_text(resp, limit)
                except BodyTooLargeError:
                    raise AnswerTooLargeError(method, url, status, limit) from None
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
            shown = None
            if location is not None and 300 <= status < 400:
                shown = _http.without_user(location)
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

    async def version(self, path: str, *, timeout_s: float) -> Version:
        """The ``"version"`` of the JSON object ``GET path`` answers, parsed.

        Raises :class:`VersionError` when the answer is not JSON, holds no version string or
        one that does not parse, and what :meth:`request` raises.
        """
        text = (await self.request("GET", path, timeout_s=timeout_s)).text
        try:
            body = json.loads(text)
        except json.JSONDecodeError:
            raise VersionError(
                f"{self.base_url}{path} did not answer JSON: {text[:100]!r}"
            ) from None
        version = body.get("version") if isinstance(body, dict) else None
        if not isinstance(version, str):
            raise VersionError(f"{self.base_url}{path} gave no version: {body!r}")
        return parse_version(version)


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
