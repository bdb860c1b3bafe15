"""OTLP trace exports decoded into the plain spans aprof keeps, with the OpenTelemetry
project's own messages (``opentelemetry-proto``): protobuf bodies as they are, JSON bodies in
OTLP's JSON form (ids in hex, where protobuf's JSON mapping has base64)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any, Final

from aprof._errors import AprofError

if TYPE_CHECKING:
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
_IDS: Final = ("traceId", "spanId", "parentSpanId")


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


def decode(body: bytes, content_type: str) -> list[dict[str, Any]]:
    """The spans of one OTLP/HTTP trace export (``BodyError``: 415 for another content type,
    400 for a body that is not one)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise BodyError(400, f"not an OTLP protobuf export: {exc}") from None
    elif content_type == JSON:
        try:
            data = json.loads(body)
            json_format.ParseDict(_base64_ids(data), request, ignore_unknown_fields=True)
        except (ValueError, TypeError, RecursionError, json_format.ParseError) as exc:
            raise BodyError(400, f"not an OTLP JSON export: {exc}") from None
    else:
        raise BodyError(415, f"{content_type or 'no content type'}: send {PROTOBUF} or {JSON}")
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


def _base64_ids(data: Any) -> Any:
    """``data`` (OTLP JSON) with its spans' and links' hex ids as protobuf's JSON mapping
    wants them (base64); raises ``ValueError`` for an id that is not hex."""
    if not isinstance(data, dict):
        raise ValueError("the body is not a JSON object")
    for resource_spans in _list(data.get("resourceSpans")):
        for scope_spans in _list(_dict(resource_spans).get("scopeSpans")):
            for span in _list(_dict(scope_spans).get("spans")):
                _convert(_dict(span))
                for link in _list(span.get("links")):
                    _convert(_dict(link))
    return data


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
