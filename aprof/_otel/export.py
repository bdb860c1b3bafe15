"""A run's own spans as OpenTelemetry spans (``aprof export otlp``): its steps, requests,
turns, tool calls, stages and capture windows, read back from its timelines and sent with the
OpenTelemetry SDK's OTLP/HTTP exporter.

Each step is one trace, as the requests' trace context has it (the run's ``trace_salt``, then
the step): the step's span is its root; its requests, spans and windows are its children; a
request's span id is the one its ``traceparent`` carried, so the servers' own spans of it
(vLLM's ``llm_request``) join it as its children in Jaeger, Tempo or any OTLP backend.

Each batch is bounded in time as a whole: connect, send, the answer's last byte and the
exporter's own retries. The exporter's own ``timeout`` is not enough for that (its HTTP client
bounds each read of the socket, so an endpoint that trickles its answer a byte at a time holds
it for ever): each batch is sent from a daemon thread, waited for until the deadline, then
left to the exporter's shutdown (a process that ends does not wait for it). The endpoint's user
and password are never shown: every message names it as ``aprof._http.without_user`` gives
it, and the exporter's own log lines are taken in, with the credentials blanked, as the reason
of the one error raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeGuard

import yarl

from aprof._config import StepSelection
from aprof._http import without_user
from aprof._manifest import Manifest, load_manifest
from aprof._otel.spans import NO_STEP
from aprof._timeline.recorder import span_id_of
from aprof._traces.files import read_trace_below

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

MAX_PART_BYTES: Final = 1 << 30
"""A timeline part read at most."""
BATCH: Final = 512
"""Spans sent per export call."""
KINDS: Final = {"request": "CLIENT", "span": "INTERNAL", "capture": "INTERNAL"}
"""The OpenTelemetry span kind of each timeline category (a request is a call to a server)."""
SCHEMES: Final = ("http", "https")
"""The schemes of an OTLP/HTTP endpoint."""
_SDK_LOGGER: Final = "opentelemetry.exporter.otlp.proto.http"
"""Where the SDK's exporter logs why a batch failed."""
_REASON_CHARS: Final = 300
"""The most of the exporter's reasons a message shows."""
_USERINFO: Final = re.compile(r"//[^/@\s]*@")
"""A URL's user and password, in a line of text."""


@dataclass(frozen=True)
class Exported:
    """What :func:`export_run` sent."""

    sent: int
    """Spans the endpoint took."""
    endpoint: str
    """The traces URL they went to, without user and password (to be shown)."""
    problems: tuple[str, ...]
    """The timeline parts that could not be read, one line each."""


def export_run(
    save_path: str | os.PathLike[str],
    endpoint: str,
    *,
    steps: StepSelection | None = None,
    timeout_s: float = 10.0,
) -> Exported:
    """Send the spans of the run in ``save_path`` (of ``steps``, default all) to ``endpoint``,
    each batch within ``timeout_s`` (connect, send, answer and retries).

    Raises ``ValueError`` for an endpoint that is not an http(s) URL or a timeout not above 0,
    ``ManifestError`` without a readable manifest, ``ImportError`` without the SDK's exporter,
    ``ConnectionError`` when the endpoint does not take a batch and ``TimeoutError`` when a
    batch is not taken within ``timeout_s``; no message shows the endpoint's credentials.
    """
    url = traces_url(endpoint)
    if not timeout_s > 0:
        raise ValueError(f"the timeout must be more than 0 s, got {timeout_s:g}")
    require()
    root = Path(save_path)
    manifest = load_manifest(root)
    problems: list[str] = []
    spans = plain_spans(root, manifest, steps, problems)
    sent = export(spans, url, run_id=manifest.run_id, timeout_s=timeout_s)
    return Exported(sent, without_user(url), tuple(problems))


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``endpoint`` (a base URL, ``/v1/traces`` added, or the whole
    traces URL). Raises ``ValueError`` naming what is wrong (without its credentials) for one
    that is not an http:// or https:// URL with a host."""
    shown = without_user(endpoint)
    try:
        parsed = yarl.URL(endpoint)
    except ValueError:
        raise ValueError(f"endpoint {shown}: not a URL") from None
    if parsed.scheme.lower() not in SCHEMES:
        scheme = f"{parsed.scheme}://" if parsed.scheme else "no scheme"
        raise ValueError(
            f"endpoint {shown}: {scheme} is not supported: OTLP/HTTP takes http:// or https://"
        )
    if not parsed.host:
        raise ValueError(f"endpoint {shown}: no host")
    if endpoint.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return f"{endpoint.rstrip('/')}/v1/traces"


def require() -> None:
    """Raise ``ImportError`` saying what to install without the SDK's OTLP/HTTP exporter."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: F401
            OTLPSpanExporter,
        )
    except ImportError as exc:
        raise ImportError(
            f"exporting OTLP spans needs the OpenTelemetry SDK's OTLP/HTTP exporter: "
            f"pip install 'aprof[otel]' ({exc})"
        ) from exc


def plain_spans(
    root: Path, manifest: Manifest, steps: StepSelection | None, problems: list[str]
) -> Iterator[dict[str, Any]]:
    """The run's spans as plain dicts (``trace_id``, ``span_id``, ``parent_span_id``,
    ``name``, ``kind``, ``start_ns``, ``end_ns``, ``attributes``), one timeline part at a
    time; a part that cannot be read is a line in ``problems``."""
    # A run from before trace context: a salt of its own, the same at every export.
    salt = manifest.trace_salt or span_id_of(manifest.run_id)
    process_open: dict[str, dict[tuple[object, object], list[dict[str, Any]]]] = {}
    for entry in manifest.timeline:
        try:
            data = read_trace_below(root, entry.path, MAX_PART_BYTES)
        except (OSError, ValueError) as exc:
            problems.append(f"{entry.path}: not exported: {exc}")
            continue
        base = data.get("baseTimeNanoseconds")
        events = data.get("traceEvents")
        if not isinstance(base, int) or not isinstance(events, list):
            problems.append(f"{entry.path}: not exported: not one of aprof's timelines")
            continue
        opened = process_open.setdefault(entry.process, {})
        for event in events:
            if isinstance(event, dict):
                span = _span_of(event, base, opened, entry.process, salt)
                if span is not None and (steps is None or _step(span) in steps):
                    yield span


def export(spans: Iterator[dict[str, Any]], url: str, *, run_id: str, timeout_s: float) -> int:
    """Send ``spans`` to the OTLP/HTTP traces ``url`` (:func:`traces_url`) in batches, each
    within ``timeout_s``; the number sent. Raises ``ConnectionError`` for a batch the endpoint
    did not take, ``TimeoutError`` for one it did not take in time."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource

    shown = without_user(url)
    exporter: Any = OTLPSpanExporter(endpoint=url, timeout=timeout_s)
    resource = Resource.create({"service.name": "aprof", "aprof.run_id": run_id})
    make = _readable(resource)
    sent = 0
    batch: list[ReadableSpan] = []
    with _reasons(url) as reasons:
        try:
            for span in spans:
                batch.append(make(span))
                if len(batch) == BATCH:
                    sent += _send(exporter, batch, shown, timeout_s, reasons)
                    batch = []
            if batch:
                sent += _send(exporter, batch, shown, timeout_s, reasons)
        finally:
            exporter.shutdown()  # also cuts a retry's wait short
    return sent


def _send(
    exporter: Any, batch: list[ReadableSpan], shown: str, timeout_s: float, reasons: list[str]
) -> int:
    """Export ``batch`` from a daemon thread, waiting for it ``timeout_s`` at most."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    done: Future[object] = Future()

    def call() -> None:
        try:
            done.set_result(exporter.export(batch))
        except BaseException as exc:  # handed to the waiting caller
            done.set_exception(exc)

    threading.Thread(target=call, name="aprof-otlp-export", daemon=True).start()
    try:
        result = done.result(timeout=timeout_s)
    except FutureTimeout:
        raise TimeoutError(
            f"{shown} did not take {len(batch)} span(s) within {timeout_s:g} s (--timeout)"
        ) from None
    if result is not SpanExportResult.SUCCESS:
        why = "; ".join(dict.fromkeys(reasons))[:_REASON_CHARS] or "refused"
        reasons.clear()
        raise ConnectionError(f"{shown} did not take {len(batch)} span(s): {why}")
    return len(batch)


@contextlib.contextmanager
def _reasons(url: str) -> Iterator[list[str]]:
    """The SDK exporter's log lines while the block runs, as one-line reasons with the URL's
    user and password blanked, kept from any other handler (they would show them)."""
    parsed = yarl.URL(url)
    passwords = sorted({p for p in (parsed.password, parsed.raw_password) if p}, key=len)[::-1]
    found: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = _USERINFO.sub("//", " ".join(record.getMessage().split()))
            for password in passwords:  # wherever else it shows
                text = text.replace(password, "***")
            found.append(text[:_REASON_CHARS])  # the reasons of one batch, cleared after

    log = logging.getLogger(_SDK_LOGGER)
    keep, propagate = Keep(), log.propagate
    log.addHandler(keep)
    log.propagate = False
    try:
        yield found
    finally:
        log.removeHandler(keep)
        log.propagate = propagate


def _readable(resource: Any) -> Callable[[dict[str, Any]], ReadableSpan]:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    sampled = TraceFlags(TraceFlags.SAMPLED)

    def make(span: dict[str, Any]) -> ReadableSpan:
        trace_id = int(span["trace_id"], 16)
        parent = span["parent_span_id"]
        return ReadableSpan(
            name=span["name"],
            context=SpanContext(trace_id, int(span["span_id"], 16), False, sampled),
            parent=None
            if parent is None
            else SpanContext(trace_id, int(parent, 16), False, sampled),
            resource=resource,
            attributes=span["attributes"],
            kind=SpanKind[span["kind"]],
            start_time=span["start_ns"],
            end_time=span["end_ns"],
        )

    return make


def _span_of(
    event: dict[str, Any],
    base: int,
    opened: dict[tuple[object, object], list[dict[str, Any]]],
    process: str,
    salt: str,
) -> dict[str, Any] | None:
    """The span ``event`` completes, if it does: a step (one ``X`` event), or the end of a
    request, span or window begun earlier in the process (``b``/``e`` pairs, nested ones
    ended first)."""
    phase, ts = event.get("ph"), event.get("ts")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return None
    at = base + round(ts * 1000)
    category = event.get("cat")
    if phase == "X" and category == "step":
        args = event.get("args")
        if not isinstance(args, dict):
            return None
        step, dur = args.get("step"), event.get("dur")
        if not _index(step) or not isinstance(dur, int | float):
            return None
        return {
            "trace_id": _trace(salt, step),
            "span_id": _step_span(step),
            "parent_span_id": None,
            "name": f"step {step}",
            "kind": "INTERNAL",
            "start_ns": at,
            "end_ns": at + round(dur * 1000),
            "attributes": _attributes(args, process),
        }
    if category not in KINDS or phase not in ("b", "e"):
        return None
    key = (category, str(event.get("id2")))
    if phase == "b":
        opened.setdefault(key, []).append({**event, "at": at})
        return None
    stack = opened.get(key)
    if not stack:
        return None
    begun = stack.pop()
    if not stack:
        del opened[key]
    args = begun.get("args")
    if not isinstance(args, dict):
        return None  # a window's phase: its window carries what there is to say
    step = args.get("step")
    request_id = args.get("request_id") if category == "request" else None
    own = (
        span_id_of(request_id)
        if isinstance(request_id, str)
        else span_id_of(f"{process}:{key[1]}:{begun['at']}")
    )
    return {
        "trace_id": _trace(salt, step if _index(step) else None),
        "span_id": own,
        "parent_span_id": _step_span(step) if _index(step) else None,
        "name": str(begun.get("name")),
        "kind": KINDS[category],
        "start_ns": begun["at"],
        "end_ns": max(at, begun["at"]),
        "attributes": _attributes(args, process),
    }


def _trace(salt: str, step: int | None) -> str:
    return salt + (NO_STEP if step is None else f"{step & ((1 << 64) - 1):016x}")


def _step_span(step: int) -> str:
    """The span id of step ``step``'s own span (its trace's root)."""
    return span_id_of(f"aprof step {step}")


def _step(span: dict[str, Any]) -> int:
    tail = span["trace_id"][16:]
    return -1 if tail == NO_STEP else int(tail, 16)


def _index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _attributes(args: dict[str, Any], process: str) -> dict[str, str | int | float | bool]:
    """The event's args as OpenTelemetry attributes (scalars; others as text, ``None`` left
    out), with the process that recorded it."""
    found: dict[str, str | int | float | bool] = {"aprof.process": process}
    for key, value in args.items():
        if value is None:
            continue
        if isinstance(value, str | int | float | bool):
            found[str(key)] = value
        else:
            found[str(key)] = str(value)
    return found
