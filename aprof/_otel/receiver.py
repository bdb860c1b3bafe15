"""The run's OTLP/HTTP receiver: the servers' own request spans, filed by step below
``save_path/otel/``.

``POST /v1/traces`` takes one OTLP trace export (protobuf or JSON, plain, gzip or deflate),
bounded:

- 200: taken, with OTLP's answer (its ``partial_success`` counts the spans not kept);
- 401: ``otel.token_file`` is set and the request does not bear its token (answered on the
  headers, the body never read);
- 413: a body over ``otel.max_body_bytes``, sent or inflated, or holding more than
  ``otel.max_spans_per_body`` spans or more fields than that many spans may hold (counted
  before anything is built); 408: a body that does not arrive within ``otel.body_s``;
- 415: another content type or coding; 400: not an OTLP export (or a broken gzip stream);
- 503: more exports in flight than it takes at once (OTLP exporters send it again later).

Its connections are bounded as every server of the run's is (``aprof/_http_server.py``).
Without a token on another address than loopback, anything that reaches the address may send:
the start says so in a warning.

Each span goes to the step its trace id names (``step_<n>.spans.jsonl``: one JSON object per
line), to ``no_step.spans.jsonl`` (this run's trace outside any step) or ``other.spans.jsonl``
(another trace: a request sent without aprof's trace context). A span of another trace that
names its request (``gen_ai.request.id``: verl's clients send no trace context) goes to the
step begun last before it started, as the profiler said (:meth:`OtelReceiver.step_began`). A
span of a step the run has not begun, or began more than ``KEEP_STEPS`` steps ago, is counted
as not kept and moves nothing (a forged trace id cannot make later spans late); at most
``otel.max_spans_per_step`` per file, the rest counted. Inflating, decoding and writing run on a
thread of their own, one export at a time, never on the event loop; a write that fails costs
its spans (counted, logged once per outage), never the run.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from aprof._config import OtelConfig
from aprof._http_server import (
    BodyRefusedError,
    BoundedServer,
    inflate,
    read_body,
    read_token,
)
from aprof._logging import logger
from aprof._otel.files import FOLDER, NO_STEP_FILE, OTHER_FILE, step_file, step_in
from aprof._otel.spans import (
    ANOTHER,
    JSON,
    PROTOBUF,
    REQUEST_ID,
    BodyError,
    decode,
    require,
    step_of,
)
from aprof._safe_files import append_file, move_aside, open_folder

IN_FLIGHT: Final = 4
"""Exports read or decoded at once; one more is answered 503."""
TOKEN_S: Final = 5.0
"""The most reading ``otel.token_file`` may take."""
CLOSE_S: Final = 10.0
"""The exports under way as it closes get this long to be answered."""
KEEP_STEPS: Final = 256
"""Steps begun whose spans are still taken, the newest ones (older ones are counted, dropped)."""
QUIET_S: Final = 1.0
"""As the profiler closes, a receiver that has taken spans waits until none came for this
long (twice the export period ``launch_spec`` gives the engines): the last step's spans are
still on their way when its requests end."""
LINGER_S: Final = 10.0
"""The most the close waits for stragglers."""


class Counts:
    """What the receiver took so far (written by its thread, read anywhere)."""

    __slots__ = ("dropped", "spans")

    def __init__(self) -> None:
        self.spans = 0
        """Spans written below ``otel/``."""
        self.dropped = 0
        """Spans not kept: over a file's cap, too late, or lost to a failed write."""


class OtelReceiver:
    """Receives OTLP trace exports for one run; ``salt`` is the run's half of its trace ids."""

    def __init__(
        self,
        config: OtelConfig,
        *,
        root: Path,
        salt: str,
        on_taken: Callable[[int, int], None],
    ) -> None:
        """``on_taken(spans, dropped)`` is told the counts on the event loop after each export
        that changed them, and once more when the receiver has closed."""
        self._config = config
        self._root = str(root)
        self._salt = salt
        self._on_taken = on_taken
        self.counts = Counts()
        self.endpoint: str | None = None
        """``http://<host>:<port>`` while it listens (OTLP's ``/v1/traces`` below it)."""
        self._server: BoundedServer | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._in_flight = 0
        self._taken = asyncio.Event()
        """An export was taken (since the close last looked)."""
        self._kept: dict[str, int] = {}  # spans kept per file, for the steps still taken
        self._newest: int | None = None
        self._began: tuple[tuple[int, int], ...] = ()
        """(wall-clock ns, step) of the steps begun, the last ``KEEP_STEPS``: replaced whole
        on the event loop, read on the receiver's thread."""
        self._failing = False

    async def start(self) -> str:
        """Listen; returns the endpoint. Raises ``ImportError`` without ``opentelemetry-proto``,
        ``ConfigError`` (``otel.token_file``) when the token file cannot be read or holds no
        usable token, and ``OSError`` when the address cannot be bound."""
        require()
        config = self._config
        token = None
        if config.token_file is not None:
            token = await read_token(config.token_file, "otel.token_file", TOKEN_S)
        elif not _loopback(config.host):
            logger.warning(
                "otel receiver takes exports from anyone who reaches it: set otel.token_file",
                host=config.host,
            )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aprof-otel")
        await asyncio.get_running_loop().run_in_executor(self._thread, self._move_aside)
        server = BoundedServer(
            [web.post("/v1/traces", self._export)],
            name="otel receiver",
            token=token,
            answer=_text,
            header_s=config.header_s,
            max_connections=config.max_connections,
            client_max_size=config.max_body_bytes,
            shutdown_s=CLOSE_S,
        )
        host, port = await server.start(config.host, config.port)
        self._server = server
        shown = f"[{host}]" if ":" in host else host
        self.endpoint = f"http://{shown}:{port}"
        return self.endpoint

    async def aclose(self) -> None:
        """Take the spans still on their way (once it has taken any: until none came for
        ``QUIET_S``, at most ``LINGER_S``), then stop listening (bounded); the exports under
        way are answered or cut off, and the counts are told a last time."""
        if self._server is not None and self._taken.is_set():
            try:
                async with asyncio.timeout(LINGER_S):
                    while True:
                        self._taken.clear()
                        async with asyncio.timeout(QUIET_S):
                            await self._taken.wait()
            except TimeoutError:
                pass  # quiet for QUIET_S, or LINGER_S in all: what came is kept
        server, self._server = self._server, None
        self.endpoint = None
        if server is not None:
            await server.aclose()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
        self._tell_counts()

    def step_began(self, step: int, wall_ns: int) -> None:
        """The profiler began ``step`` at ``wall_ns`` (``time.time_ns()``)."""
        self._began = (*self._began[-KEEP_STEPS:], (wall_ns, step))

    async def _export(self, request: web.Request) -> web.StreamResponse:
        content_type = request.content_type
        if content_type not in (PROTOBUF, JSON):
            return _text(415, f"{content_type}: send {PROTOBUF} or {JSON}")
        if self._in_flight >= IN_FLIGHT:
            return _text(503, "busy: send it again later", {"Retry-After": "1"})
        self._in_flight += 1
        try:
            limit = self._config.max_body_bytes
            loop = asyncio.get_running_loop()
            assert self._thread is not None
            try:
                body, encoding = await read_body(request, limit, self._config.body_s)
                rejected = await loop.run_in_executor(
                    self._thread, self._inflate_and_take, body, encoding, content_type
                )
            except (BodyRefusedError, BodyError) as exc:
                return _text(exc.status, str(exc))
        finally:
            self._in_flight -= 1
        self._taken.set()
        self._tell_counts()
        return _answer(content_type, rejected)

    def _tell_counts(self) -> None:
        self._on_taken(self.counts.spans, self.counts.dropped)

    # -- on the receiver's thread ---------------------------------------------------------------

    def _move_aside(self) -> None:
        """An earlier run's ``otel/`` goes aside: this run's files start empty."""
        try:
            folder = open_folder(self._root, (), create=True)
            try:
                move_aside(folder, FOLDER)
            finally:
                os.close(folder)
        except OSError as exc:
            logger.warning("otel folder not moved aside", error=str(exc))

    def _inflate_and_take(self, body: bytes, encoding: str, content_type: str) -> int:
        """:meth:`_take` of ``body`` as it inflates (bounded by ``otel.max_body_bytes``)."""
        return self._take(inflate(body, encoding, self._config.max_body_bytes), content_type)

    def _take(self, body: bytes, content_type: str) -> int:
        """Decode and file one export; the spans not kept."""
        began = self._began
        live = self._live(began)
        by_file: dict[str, list[dict[str, Any]]] = {}
        for span in decode(body, content_type, self._config.max_spans_per_body):
            by_file.setdefault(self._file_of(span, began, live), []).append(span)
        rejected = 0
        for name, spans in by_file.items():
            rejected += self._write(name, spans)
        self.counts.dropped += rejected
        return rejected

    def _live(self, began: tuple[tuple[int, int], ...]) -> frozenset[int]:
        """The steps whose spans are taken: those of ``began``, the last ``KEEP_STEPS`` the
        profiler began (it says so before the step's requests can name it)."""
        steps = {step for _, step in began}
        if not steps:
            return frozenset()
        newest = max(steps)
        if newest != self._newest:
            self._newest = newest
            # Let go of the counts of steps no longer taken: the table stays small.
            for old in [n for n in self._kept if step_in(n) >= 0 and step_in(n) not in steps]:
                del self._kept[old]
        return frozenset(steps)

    def _file_of(
        self, span: dict[str, Any], began: tuple[tuple[int, int], ...], live: frozenset[int]
    ) -> str:
        """The file ``span`` goes to; ``""`` for a step outside ``live``."""
        step = step_of(span["trace_id"], self._salt)
        if step == ANOTHER:
            named = isinstance(span["attributes"].get(REQUEST_ID), str)
            step = _step_at(span, began) if named else None
            if step is None:
                return OTHER_FILE
        elif step is None:
            return NO_STEP_FILE
        # Any 64 bits may follow the salt: a step the run has not begun (or began long ago) is
        # a stray or forged trace id, given no file of its own nor a say in which steps are taken.
        return step_file(step) if step in live else ""

    def _write(self, name: str, spans: list[dict[str, Any]]) -> int:
        """Append what ``name`` has room for; the spans not written."""
        if not name:
            return len(spans)
        room = max(0, self._config.max_spans_per_step - self._kept.get(name, 0))
        kept = spans[:room]
        if not kept:
            return len(spans)
        data = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in kept).encode()
        try:
            folder = open_folder(self._root, (FOLDER,), create=True)
            try:
                append_file(folder, name, data)
            finally:
                os.close(folder)
        except OSError as exc:
            if not self._failing:
                logger.warning("otel spans not written", file=name, error=str(exc))
            self._failing = True
            return len(spans)
        if self._failing:
            logger.warning("otel spans written again", file=name)
            self._failing = False
        self._kept[name] = self._kept.get(name, 0) + len(kept)
        self.counts.spans += len(kept)
        return len(spans) - len(kept)


def _step_at(span: dict[str, Any], began: tuple[tuple[int, int], ...]) -> int | None:
    """The step of ``began`` (wall-clock ns, step) begun last before ``span`` started."""
    for at, step in reversed(began):
        if at <= span["start_ns"]:
            return step
    return None


def _answer(content_type: str, rejected: int) -> web.Response:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    why = (
        f"{rejected} span(s) not kept: of a step the run did not begin (or began too long "
        "ago), over otel.max_spans_per_step, or not written"
    )
    if content_type == PROTOBUF:
        answer = ExportTraceServiceResponse()
        if rejected:
            answer.partial_success.rejected_spans = rejected
            answer.partial_success.error_message = why
        return web.Response(body=answer.SerializeToString(), content_type=PROTOBUF)
    data = {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": why}}
    return web.Response(text=json.dumps(data if rejected else {}), content_type=JSON)


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only this machine reaches it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, headers=headers)
