"""The run's OTLP/HTTP receiver: the servers' own request spans, filed by step below
``save_path/otel/``.

``POST /v1/traces`` takes one OTLP trace export (protobuf or JSON), bounded:

- 200: taken, with OTLP's answer (its ``partial_success`` counts the spans not kept);
- 413: a body over ``otel.max_body_bytes``; 408: a body that does not arrive in time;
- 415: another content type; 400: not an OTLP export;
- 503: more exports in flight than it takes at once (OTLP exporters send it again later).

Each span goes to the step its trace id names (``step_<n>.spans.jsonl``: one JSON object per
line), to ``no_step.spans.jsonl`` (this run's trace outside any step) or ``other.spans.jsonl``
(another trace: a request sent without aprof's trace context). A span of another trace that
names its request (``gen_ai.request.id``: verl's clients send no trace context) goes to the
step begun last before it started, as the profiler said (:meth:`OtelReceiver.step_began`); at most
``otel.max_spans_per_step`` per file, the rest counted. Decoding and writing run on a thread of
their own, one export at a time, never on the event loop; a write that fails costs its spans
(counted, logged once per outage), never the run.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from aprof._config import OtelConfig
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
READ_S: Final = 10.0
"""The most one export's body may take to arrive."""
KEEP_STEPS: Final = 256
"""Steps behind the newest one whose spans are still taken (later ones are counted, dropped)."""
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
        on_taken: Callable[[], None],
    ) -> None:
        """``on_taken`` runs on the event loop after each export that changed the counts."""
        self._config = config
        self._root = str(root)
        self._salt = salt
        self._on_taken = on_taken
        self.counts = Counts()
        self.endpoint: str | None = None
        """``http://<host>:<port>`` while it listens (OTLP's ``/v1/traces`` below it)."""
        self._runner: web.AppRunner | None = None
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
        """Listen; returns the endpoint. Raises ``ImportError`` without ``opentelemetry-proto``
        and ``OSError`` when the address cannot be bound."""
        require()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="aprof-otel")
        await asyncio.get_running_loop().run_in_executor(self._thread, self._move_aside)
        app = web.Application(client_max_size=self._config.max_body_bytes)
        app.router.add_post("/v1/traces", self._export)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._config.host, self._config.port, reuse_port=False)
            await site.start()
            host, port = runner.addresses[0][:2]
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        shown = f"[{host}]" if ":" in str(host) else host
        self.endpoint = f"http://{shown}:{port}"
        return self.endpoint

    async def aclose(self) -> None:
        """Take the spans still on their way (once it has taken any: until none came for
        ``QUIET_S``, at most ``LINGER_S``), then stop listening (bounded); the exports under
        way are answered or cut off."""
        if self._runner is not None and self._taken.is_set():
            try:
                async with asyncio.timeout(LINGER_S):
                    while True:
                        self._taken.clear()
                        async with asyncio.timeout(QUIET_S):
                            await self._taken.wait()
            except TimeoutError:
                pass  # quiet for QUIET_S, or LINGER_S in all: what came is kept
        runner, self._runner = self._runner, None
        self.endpoint = None
        if runner is not None:
            try:
                async with asyncio.timeout(2 * READ_S):
                    await runner.cleanup()
            except TimeoutError:
                logger.warning("otel receiver did not close in time")
        if self._thread is not None:
            self._thread.shutdown(wait=False)

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
            try:
                async with asyncio.timeout(READ_S):
                    body = await request.read()  # 413 past client_max_size, by aiohttp
            except TimeoutError:
                return _text(408, f"the body did not arrive within {READ_S:g}s")
            loop = asyncio.get_running_loop()
            assert self._thread is not None
            try:
                rejected = await loop.run_in_executor(self._thread, self._take, body, content_type)
            except BodyError as exc:
                return _text(exc.status, str(exc))
        finally:
            self._in_flight -= 1
        self._taken.set()
        self._on_taken()
        return _answer(content_type, rejected)

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

    def _take(self, body: bytes, content_type: str) -> int:
        """Decode and file one export; the spans not kept."""
        by_file: dict[str, list[dict[str, Any]]] = {}
        for span in decode(body, content_type):
            by_file.setdefault(self._file_of(span), []).append(span)
        rejected = 0
        for name, spans in by_file.items():
            rejected += self._write(name, spans)
        self.counts.dropped += rejected
        return rejected

    def _file_of(self, span: dict[str, Any]) -> str:
        step = step_of(span["trace_id"], self._salt)
        if step == ANOTHER:
            named = isinstance(span["attributes"].get(REQUEST_ID), str)
            step = self._step_at(span) if named else None
            if step is None:
                return OTHER_FILE
        elif step is None:
            return NO_STEP_FILE
        if self._newest is None or step > self._newest:
            self._newest = step
            # Let go of the counts of steps no longer taken: the table stays small.
            for old in [n for n in self._kept if step_in(n) < step - KEEP_STEPS]:
                del self._kept[old]
        if step < self._newest - KEEP_STEPS:
            return ""  # too late to be taken
        return step_file(step)

    def _step_at(self, span: dict[str, Any]) -> int | None:
        """The step begun last before ``span`` started, if one did."""
        for began, step in reversed(self._began):
            if began <= span["start_ns"]:
                return step
        return None

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


def _answer(content_type: str, rejected: int) -> web.Response:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    why = f"{rejected} span(s) not kept: over otel.max_spans_per_step, or not written"
    if content_type == PROTOBUF:
        answer = ExportTraceServiceResponse()
        if rejected:
            answer.partial_success.rejected_spans = rejected
            answer.partial_success.error_message = why
        return web.Response(body=answer.SerializeToString(), content_type=PROTOBUF)
    data = {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": why}}
    return web.Response(text=json.dumps(data if rejected else {}), content_type=JSON)


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, headers=headers)
