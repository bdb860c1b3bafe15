"""OTLP trace exports decoded into the plain spans aprof keeps, with the OpenTelemetry
project's own messages (``opentelemetry-proto``): protobuf bodies as they are, JSON bodies in
OTLP's JSON form (ids in hex, where protobuf's JSON mapping has base64)."""

from __future__ import annotations

import base64
import binascii
import functools
import json
from typing import TYPE_CHECKING, Any, Final

from aprof._errors import AprofError

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
MAX_ATTRIBUTES: Final = 64
"""Attributes kept per span (the first ones); the others are counted in ``attributes_dropped``."""
MAX_TEXT: Final = 1024
"""Characters kept of a span's name and of each string attribute."""
NO_STEP: Final = "f" * 16
"""The step half of a trace id given outside any step."""
LATENCIES: Final = {
    "queued": "gen_ai.latency.time_in_queue",
    "prefill": "gen_ai.latency.time_in_model_prefill",
    "decode": "gen_ai.latency.time_in_model_decode",
    "e2e": "gen_ai.latency.e2e",
}
"""A server's span of a request: the attribute (seconds, vLLM's names) giving each of its
phases, in the order they run, and its whole time on the server."""
REQUEST_ID: Final = "gen_ai.request.id"
"""The attribute naming the request a server's span is of (vLLM: the id its engine was given;
SGLang: the request's ``rid``): how a span sent without trace context finds its request."""
ANOTHER: Final = -1
"""The "step" of a trace that is not this run's."""
ITEMS_PER_SPAN: Final = 64
"""What an export may hold per span it may hold, and as much again for its resources and
scopes, counted before anything is built: protobuf fields, at any depth, or JSON's ``{``,
``[``, ``,`` and ``:`` (one before each object, array, key or value ``json.loads`` builds).
Real spans hold fewer: vLLM's ``llm_request`` 62 fields (108 JSON items), SGLang's 18 on
average (its request's root 79). The most a 4 MiB export of real spans holds is about 400,000
fields (6,600 vLLM spans) or 360,000 JSON items (3,350): a bomb within 64 a span (524,352 at
the default 8,192 spans) costs what such an export costs (``benchmarks/bench_span_bombs.py``)."""
MAX_DEPTH: Final = 100
"""Messages nested below an export at most: protobuf's own limit (upb's and json_format's)."""
_IDS: Final = ("traceId", "spanId", "parentSpanId")
_LEN: Final = 2
"""Protobuf's wire type of a length-delimited field (a message, bytes, a string)."""
_NOT_PROTOBUF: Final = "not an OTLP protobuf export"
_NOT_JSON: Final = "not an OTLP JSON export"


class BodyError(AprofError, ValueError):
    """An export aprof does not take: ``status`` is the HTTP answer, the message says why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def require() -> None:
    """Raise ``ImportError`` saying what to install when ``opentelemetry-proto`` is missing."""
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"receiving OTLP spans needs opentelemetry-proto: pip install 'aprof[otel]' ({exc})"
        ) from exc


def decode(body: bytes, content_type: str, max_spans: int) -> list[dict[str, Any]]:
    """The spans of one OTLP/HTTP trace export of at most ``max_spans`` spans (``BodyError``:
    413 for an export of more, or of more than ``ITEMS_PER_SPAN`` items a span, told before
    more than that many are built; 415 for another content type; 400 for a body that is not
    an export, or nests messages deeper than ``MAX_DEPTH``)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        # Each field takes two bytes at least (its key, then a value or a length): a body of
        # at most twice the budget holds no more fields than the budget, and protobuf's parse
        # bounds its nesting itself. Only a larger one is walked first.
        if len(body) > 2 * _budget(max_spans):
            _bound_protobuf(body, max_spans)
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise BodyError(400, f"{_NOT_PROTOBUF}: {exc}") from None
    elif content_type == JSON:
        data = _json_export(body, max_spans)
        try:
            json_format.ParseDict(data, request, ignore_unknown_fields=True)
        except (ValueError, TypeError, RecursionError, json_format.ParseError) as exc:
            raise BodyError(400, f"{_NOT_JSON}: {exc}") from None
    else:
        raise BodyError(415, f"{content_type or 'no content type'}: send {PROTOBUF} or {JSON}")
    spans = sum(len(scope.spans) for group in request.resource_spans for scope in group.scope_spans)
    if spans > max_spans:
        raise BodyError(413, _over(max_spans, "spans"))
    return _spans(request)


def step_of(trace_id: str, salt: str) -> int | None:
    """The step a trace id of this run names (``None``: outside any step), or ``ANOTHER``
    for a trace id that is not this run's (``salt``: the run's half of its trace ids)."""
    if len(trace_id) != 32 or not trace_id.startswith(salt):
        return ANOTHER
    tail = trace_id[16:]
    return None if tail == NO_STEP else int(tail, 16)


def _spans(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    found = []
    for resource_spans in request.resource_spans:
        service = None
        for kv in resource_spans.resource.attributes:
            if kv.key == "service.name" and kv.value.HasField("string_value"):
                service = kv.value.string_value[:MAX_TEXT]
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {
                    kv.key[:MAX_TEXT]: _value(kv.value) for kv in span.attributes[:MAX_ATTRIBUTES]
                }
                found.append(
                    {
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "trace_state": span.trace_state[:MAX_TEXT] or None,
                        "name": span.name[:MAX_TEXT],
                        "kind": int(span.kind),
                        "start_ns": int(span.start_time_unix_nano),
                        "end_ns": int(span.end_time_unix_nano),
                        "service": service,
                        "status": int(span.status.code),
                        "attributes": attributes,
                        "attributes_dropped": max(0, len(span.attributes) - MAX_ATTRIBUTES)
                        + int(span.dropped_attributes_count),
                    }
                )
    return found


def _value(value: AnyValue) -> str | int | float | bool | None:
    """An attribute's value as JSON keeps it: a scalar, or the text of anything else."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value[:MAX_TEXT]
    if which in ("int_value", "double_value", "bool_value"):
        scalar: int | float | bool = getattr(value, which)
        return scalar
    if which is None:
        return None
    return str(value)[:MAX_TEXT].strip()


def _bound_protobuf(body: bytes, most: int) -> None:
    """Raise ``BodyError`` before anything is built: 413 once ``body`` holds more fields, at
    any depth, than ``_budget(most)``; 400 for messages nested deeper than ``MAX_DEPTH`` or
    broken framing. It reads at most ``_budget(most)`` fields, never the whole of a bomb."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    _Walk(body, most).message(0, len(body), ExportTraceServiceRequest.DESCRIPTOR, 0)


class _Walk:
    """One walk of an export's protobuf wire format through the messages of its schema."""

    def __init__(self, body: bytes, most: int) -> None:
        self.body = body
        self.most = most
        self.left = _budget(most)
        """Fields the export may still hold."""

    def message(self, at: int, end: int, descriptor: Descriptor, depth: int) -> None:
        """Count the fields of the message in ``body[at:end]`` and of every message in it."""
        if depth > MAX_DEPTH:
            raise BodyError(400, f"{_NOT_PROTOBUF}: messages nested over {MAX_DEPTH} deep")
        children = _children(descriptor)
        body, left = self.body, self.left
        while at < end:
            left -= 1
            if left < 0:
                raise BodyError(413, _over_budget(self.most, "protobuf fields"))
            # Keys, lengths and values of one byte inline: this loop is the whole cost.
            key = body[at]
            if key < 0x80:
                at += 1
            else:
                key, at = _varint(body, at, end)
            wire, start = key & 7, at
            if wire == _LEN:
                if at < end and body[at] < 0x80:
                    start = at + 1
                    at = start + body[at]
                else:
                    length, start = _varint(body, at, end)
                    at = start + length
            elif wire == 0:
                if at < end and body[at] < 0x80:
                    at += 1
                else:
                    _, at = _varint(body, at, end)
            elif wire == 1:
                at += 8
            elif wire == 5:
                at += 4
            else:
                raise BodyError(400, f"{_NOT_PROTOBUF}: wire type {wire} at byte {start - 1}")
            if at > end:
                raise BodyError(400, f"{_NOT_PROTOBUF}: a field runs past its message's end")
            child = children.get(key)
            if child is not None:
                self.left = left
                self.message(start, at, child, depth + 1)
                left = self.left
        self.left = left


@functools.cache
def _children(descriptor: Descriptor) -> dict[int, Descriptor]:
    """The message-typed fields of ``descriptor``'s message, by their key on the wire (their
    number and the length-delimited wire type)."""
    return {
        field.number << 3 | _LEN: field.message_type
        for field in descriptor.fields
        if field.message_type is not None
    }


def _varint(body: bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at ``body[at]`` and where it ends."""
    value = 0
    for shift in range(0, 70, 7):
        if at >= end:
            raise BodyError(400, f"{_NOT_PROTOBUF}: cut short in a varint")
        byte = body[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
    raise BodyError(400, f"{_NOT_PROTOBUF}: a varint of more than 10 bytes")


def _budget(most: int) -> int:
    """The items an export of at most ``most`` spans may hold: ``ITEMS_PER_SPAN`` per span,
    and as many again for its resources and scopes."""
    return (most + 1) * ITEMS_PER_SPAN


def _over(most: int, what: str) -> str:
    return f"an export holds at most {most} {what} (otel.max_spans_per_body); this one more"


def _over_budget(most: int, what: str, count: str = "more") -> str:
    return (
        f"an export of at most {most} spans (otel.max_spans_per_body) holds at most "
        f"{_budget(most)} {what} ({ITEMS_PER_SPAN} a span); this one {count}"
    )


def _json_export(body: bytes, most: int) -> dict[str, Any]:
    """``body``, an OTLP JSON export of at most ``_budget(most)`` items, with its ids as
    protobuf's JSON mapping wants them (``BodyError``: 413 for more items, 400 for another
    body)."""
    # json.loads builds every object, array, key and value of the body at once: bound them
    # first (bytes counted in C, nothing built; each follows a `{`, `[`, `,` or `:`, and those
    # inside strings only count too many).
    items = sum(body.count(mark) for mark in (b"{", b"[", b",", b":"))
    if items > _budget(most):
        raise BodyError(413, _over_budget(most, "JSON items ({, [, , and :)", str(items)))
    try:
        data = _dict(json.loads(body))
        for span in _json_spans(data):
            _base64_ids(span)
    except (ValueError, RecursionError) as exc:
        raise BodyError(400, f"{_NOT_JSON}: {exc}") from None
    return data


def _json_spans(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The spans of ``data`` (OTLP JSON); raises ``ValueError`` for a body not shaped as one."""
    return [
        _dict(span)
        for resource_spans in _list(data.get("resourceSpans"))
        for scope_spans in _list(_dict(resource_spans).get("scopeSpans"))
        for span in _list(_dict(scope_spans).get("spans"))
    ]


def _base64_ids(span: dict[str, Any]) -> None:
    """``span``'s and its links' hex ids (OTLP JSON) as protobuf's JSON mapping wants them
    (base64); raises ``ValueError`` for an id that is not hex."""
    _convert(span)
    for link in _list(span.get("links")):
        _convert(_dict(link))


def _convert(holder: dict[str, Any]) -> None:
    for key in _IDS:
        text = holder.get(key)
        if isinstance(text, str) and text:
            try:
                holder[key] = base64.b64encode(bytes.fromhex(text)).decode("ascii")
            except (ValueError, binascii.Error):
                raise ValueError(f"{key} {text[:40]!r} is not hex") from None


def _list(value: object) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"expected a list, not {type(value).__name__}")
    return value


def _dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, not {type(value).__name__}")
    return value
