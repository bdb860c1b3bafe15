"""``LLMClient``: completions from a fleet of replicas over HTTP, each request through aprof."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp
import structlog
import yarl

import aprof
from agentloop import _dialects
from agentloop._balancer import ReplicaBalancer
from agentloop._dialects import Answer, Api
from agentloop._errors import BadAnswer, LLMError
from agentloop._sse import SSEDecoder
from aprof import UsageError, _http
from aprof._errors import BodyTooLargeError

_BODY_SHOWN = 300
"""Characters of an error body kept in an LLMError (servers may answer with whole pages)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """One generated completion and what aprof knew about its request."""

    text: str
    """The generated text."""
    finish_reason: str | None
    """Why generation ended (``length``, ``stop``, ...), as the server says."""
    prompt_tokens: int | None
    """Prompt tokens, as the server counts them."""
    completion_tokens: int | None
    """Generated tokens, as the server counts them."""
    replica: int
    """The replica that generated it."""
    request_id: str | None
    """The caller's identifier of the request."""
    step: int | None
    """The global step the request was admitted in (``None`` without a profiler or outside
    any step); a request that finishes in a later step still belongs to this one."""
    gated: bool
    """The request waited for its replica's capture to start."""
    captured: bool
    """A capture of its replica was active when the request went ahead."""
    failed_over_from: tuple[int, ...] = ()
    """Replicas that refused the connection before this one took the request."""


class LLMClient:
    """Completions from a fleet of replicas (index ``i`` = ``replicas[i]``), one aiohttp session.

    Use as ``async with LLMClient(urls, prof=prof) as llm:``. Each request goes to the replica
    the :class:`ReplicaBalancer` picks, inside ``prof.request(replica=..., request_id=...)``
    (gated while that replica's capture starts, counted, recorded); ``prof`` is an
    :class:`aprof.Profiler`, or in another Ray process ``aprof.ray.connect(...)``'s remote
    profiler; with ``prof=None`` nothing is profiled. ``api`` is ``"openai"``
    (``/v1/completions``) or ``"sglang"`` (``/generate``). A request is sent once: only a
    connection that could not be made (nothing sent) is tried on another replica, each at
    most once. ``timeout_s`` bounds each request from the moment aprof admits it to the last
    byte of the answer; ``connect_timeout_s`` bounds connecting, the name lookup included;
    ``max_answer_bytes`` bounds each answer, whole or streamed. As the server adapters do
    (both send through ``aprof._http``), it follows no redirect, uses no connection again
    after a non-2xx answer, and sends the user and password of a replica URL as HTTP Basic
    auth without ever showing them in an error or a log.
    """

    def __init__(
        self,
        replicas: Sequence[str],
        *,
        api: Api = "openai",
        model: str | None = None,
        prof: aprof.RolloutProfiler | None = None,
        api_key: str | None = None,
        stream: bool = False,
        timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        avoid_s: float = 30.0,
        max_answer_bytes: int = _http.ANSWER_BYTES,
    ) -> None:
        if isinstance(replicas, str) or not replicas:
            raise ValueError("replicas must be a non-empty list of base URLs")
        for url in replicas:
            parsed = yarl.URL(url) if url.startswith(("http://", "https://")) else None
            if parsed is None or not parsed.host:
                shown = _http.without_user(url)
                raise ValueError(f"a replica URL is http(s)://host[:port][/path], got {shown!r}")
            if api_key and (parsed.user is not None or parsed.password is not None):
                raise ValueError(
                    "give the replicas' credentials either in their URLs or as api_key"
                )
        if api not in ("openai", "sglang"):
            raise ValueError(f"api must be 'openai' or 'sglang', got {api!r}")
        for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if type(max_answer_bytes) is not int or max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be an int >= 1, got {max_answer_bytes!r}")
        self.urls = tuple(url.rstrip("/") for url in replicas)
        """The base URL of each replica."""
        self.api: Api = api
        """The completion API the replicas are spoken to in."""
        self.prof = prof
        """The profiler every request reports to, if any."""
        self.balancer = ReplicaBalancer(len(self.urls), avoid_s=avoid_s)
        """Picks the replica of each request."""
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._stream = stream
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_answer_bytes = max_answer_bytes
        self._shown = tuple(_http.without_user(url) for url in self.urls)
        self._session: aiohttp.ClientSession | None = None
        self._log = structlog.get_logger("agentloop").bind(api=api)

    async def __aenter__(self) -> LLMClient:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Create the HTTP session (idempotent)."""
        if self._session is None:
            self._session = _http.session(
                connect_s=self._connect_timeout_s,
                headers=self._headers,
                # The runner bounds concurrency; a pool limit would only queue requests
                # inside the per-request timeout.
                connections=0,
            )

    async def aclose(self) -> None:
        """Close the HTTP session (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: str | Sequence[str] = (),
        prefer: int | None = None,
        request_id: str | None = None,
        trajectory: str | None = None,
        turn: int | None = None,
    ) -> Completion:
        """Complete ``prompt``, on replica ``prefer`` while it is up (else the least busy one);
        ``trajectory`` and ``turn`` name the agent-loop run and turn it is, on the profiler's
        timeline.

        ``prompt`` is text, or token IDs (sent as ``prompt`` in the openai API, as
        ``input_ids`` in the sglang one). Raises :class:`LLMError` when the request fails,
        :class:`PromptError` (a ``ValueError``) for a token-ID prompt that is empty or holds a
        non-integer or negative ID, ``ValueError`` for ``max_tokens`` < 1, and
        :class:`aprof.UsageError` (a ``RuntimeError``) before :meth:`open` or after :meth:`aclose`.
        """
        if self._session is None:
            raise UsageError("open the LLMClient first: `async with LLMClient(...) as llm:`")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        payload = _dialects.body(
            self.api,
            prompt if isinstance(prompt, str) else _dialects.token_ids(prompt),
            model=self._model,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            stream=self._stream,
        )
        refused: list[int] = []
        while True:
            replica = self.balancer.acquire(prefer=prefer, exclude=refused)
            assert replica is not None  # some replica has not refused yet
            try:
                return await self._attempt(
                    replica, payload, request_id, tuple(refused), (trajectory, turn)
                )
            except LLMError as exc:
                self._log.warning(
                    "completion request failed", request_id=request_id, error=str(exc)
                )
                if exc.kind in ("connect", "disconnected"):
                    self.balancer.failed(replica)
                if exc.kind != "connect":
                    raise  # the request may have reached the server: never send it again
                refused.append(replica)
                if len(refused) == len(self.urls):
                    raise
            finally:
                self.balancer.release(replica)

    async def _attempt(
        self,
        replica: int,
        payload: dict[str, Any],
        request_id: str | None,
        refused: tuple[int, ...],
        turn_of: tuple[str | None, int | None],
    ) -> Completion:
        if self.prof is None:
            answer = await self._send(replica, payload, _headers(request_id))
            step, gated, captured = None, False, False
        else:
            async with self.prof.request(replica=replica, request_id=request_id) as req:
                req.trajectory, req.turn = turn_of
                headers = _headers(request_id, req.traceparent, req.tracestate)
                answer = await self._send(replica, payload, headers)
                req.forward(tokens=answer.completion_tokens or 0)
                req.prompt_tokens = answer.prompt_tokens or 0
            step, gated, captured = req.step, req.gated, req.captured
        self.balancer.succeeded(replica)
        return Completion(
            text=answer.text,
            finish_reason=answer.finish_reason,
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            replica=replica,
            request_id=request_id,
            step=step,
            gated=gated,
            captured=captured,
            failed_over_from=refused,
        )

    async def _send(
        self, replica: int, payload: dict[str, Any], headers: dict[str, str] | None
    ) -> Answer:
        """One HTTP exchange with ``replica``; every failure becomes an :class:`LLMError`."""
        assert self._session is not None
        route = _dialects.path(self.api)
        url, shown = self.urls[replica] + route, self._shown[replica] + route
        bounds = _http.client_timeout(self._connect_timeout_s)  # the whole: asyncio.timeout
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                _http.send(
                    self._session, "POST", url, json=payload, headers=headers, timeout=bounds
                ) as resp,
            ):
                if not 200 <= resp.status < 300:
                    cause = await self._status_cause(resp)
                    raise LLMError(replica, shown, "status", cause, resp.status)
                if self._stream:
                    return await self._read_stream(resp)
                text = await _http.read_text(resp, self._max_answer_bytes, errors="strict")
                return _dialects.read_whole(self.api, json.loads(text) if text.strip() else None)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # Raised while connecting, before any byte of the request was written.
            raise LLMError(replica, shown, "connect", aprof.describe(exc)) from exc
        except TimeoutError as exc:
            cause = f"no complete answer within {self._timeout_s:g} s"
            raise LLMError(replica, shown, "timeout", cause) from exc
        except aiohttp.ClientError as exc:
            raise LLMError(replica, shown, "disconnected", aprof.describe(exc)) from exc
        except BodyTooLargeError as exc:
            cause = f"{exc} (max_answer_bytes): not read further"
            raise LLMError(replica, shown, "response", cause) from exc
        except ValueError as exc:  # BadAnswer, and JSON or UTF-8 that does not decode
            raise LLMError(replica, shown, "response", str(exc)) from exc

    async def _status_cause(self, resp: aiohttp.ClientResponse) -> str:
        """What a non-2xx answer says: the start of its body, else its reason phrase."""
        try:
            text = await _http.read_text(resp, self._max_answer_bytes)
        except BodyTooLargeError as exc:
            return f"{exc} (max_answer_bytes)"
        return " ".join(text.split())[:_BODY_SHOWN] or resp.reason or ""

    async def _read_stream(self, resp: aiohttp.ClientResponse) -> Answer:
        """The completion in a stream of events, at most ``max_answer_bytes`` of it in all."""
        answer = Answer()
        decoder = SSEDecoder()
        body = _http.chunks(resp, self._max_answer_bytes)
        async with contextlib.aclosing(body):  # closed also when [DONE] ends the reading
            async for chunk in body:
                for data in decoder.feed(chunk):
                    if data == _dialects.DONE:
                        return answer
                    _dialects.read_chunk(self.api, answer, json.loads(data))
        raise BadAnswer(f"the stream ended without {_dialects.DONE}")


def _headers(
    request_id: str | None, traceparent: str | None = None, tracestate: str | None = None
) -> dict[str, str] | None:
    """The request's own headers: its id, and its W3C trace context when the profiler
    gives one (the servers' spans of the request become children of aprof's and carry its
    replica back)."""
    headers = {}
    if request_id:
        headers["X-Request-Id"] = request_id
    if traceparent:
        headers["traceparent"] = traceparent
    if tracestate:
        headers["tracestate"] = tracestate
    return headers or None
