"""What one hostile OTLP export costs the receiver's decode: peak memory grown and time taken
by ``aprof._otel.spans.decode`` for bodies that build millions of objects inside one span
(events, attributes, array values, repeated strings), nest values deeply, or repeat scalars,
each as large as ``otel.max_body_bytes`` takes by default (4 MiB); for one within the budget
of ``aprof._otel.spans.ITEMS_PER_SPAN`` fields a span (parsed with no walk first); and, to
compare, for real-shaped exports (spans like vLLM's ``llm_request``): as many as 4 MiB holds,
and ``otel.max_spans_per_body`` (8,192) of them.

Each body is decoded in a process of its own (this file with ``--one FILE TYPE``): the growth of its
peak RSS (Linux's ``VmHWM``) over what importing the decoder cost, and the wall time of the one
call. Reported per body: its size, the answer (``ok`` with the spans, or the status), MiB
grown, seconds.

Run with ``python benchmarks/bench_span_bombs.py`` (about half a minute).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LIMIT = 4 << 20
"""``otel.max_body_bytes`` by default: every bomb is at most this."""
BOUND = 8192
"""``otel.max_spans_per_body`` by default."""
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def _head(field: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field."""
    head = bytearray([field << 3 | 2])
    while length >= 0x80:
        head.append(length & 0x7F | 0x80)
        length >>= 7
    head.append(length)
    return bytes(head)


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _head(field, len(payload)) + payload


def _in_span(span: bytes) -> bytes:
    """An export of one span (its fields ``span``) in one scope of one resource."""
    return _ld(1, _ld(2, _ld(2, span)))


def _fill(unit: bytes, room: int = LIMIT - 64) -> bytes:
    return unit * (room // len(unit))


def _nested_protobuf(levels: int) -> bytes:
    """One attribute whose value is an array holding an array ... ``levels`` deep; built from
    the inside out with the headers alone (no copy of the inner bytes per level)."""
    heads: list[bytes] = []
    inner = 0
    for _ in range(levels):
        for field in (1, 5):  # ArrayValue.values, then AnyValue.array_value
            heads.append(_head(field, inner))
            inner += len(heads[-1])
    return _in_span(_ld(9, _ld(2, b"".join(reversed(heads)))))


def _json_export(spans: str) -> bytes:
    return ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + spans + "]}]}]}").encode()


def _json_span(inner: str) -> str:
    return '{"traceId":"' + "ab" * 16 + '","spanId":"' + "cd" * 8 + '",' + inner + "}"


def _vllm_span(i: int) -> dict[str, object]:
    """A span as vLLM 0.32 sends for a request (``llm_request``, 13 attributes)."""
    attributes = {
        "gen_ai.latency.time_to_first_token": 0.05,
        "gen_ai.latency.e2e": 1.2,
        "gen_ai.latency.time_in_queue": 0.01,
        "gen_ai.usage.prompt_tokens": 512,
        "gen_ai.usage.completion_tokens": 256,
        "gen_ai.latency.time_in_model_prefill": 0.04,
        "gen_ai.latency.time_in_model_decode": 1.1,
        "gen_ai.latency.time_in_model_inference": 1.14,
        "gen_ai.request.id": f"chatcmpl-{i:032x}",
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.max_tokens": 1024,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.n": 1,
    }
    return {"name": "llm_request", "attributes": attributes}


def _real(spans: int) -> tuple[bytes, bytes]:
    """An export of ``spans`` vLLM-shaped spans, as the SDK encodes it (protobuf, OTLP JSON)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    group = request.resource_spans.add()
    for key, text in (
        ("service.name", "vllm"),
        ("telemetry.sdk.language", "python"),
        ("telemetry.sdk.name", "opentelemetry"),
        ("telemetry.sdk.version", "1.38.0"),
    ):
        group.resource.attributes.add(key=key).value.string_value = text
    scope = group.scope_spans.add()
    scope.scope.name = "vllm.v1.engine.output_processor"
    for i in range(spans):
        made = _vllm_span(i)
        span = scope.spans.add(name=str(made["name"]), kind=2)
        span.trace_id, span.span_id = (i + 1).to_bytes(16, "big"), (i + 1).to_bytes(8, "big")
        span.parent_span_id = (i + 2).to_bytes(8, "big")
        span.start_time_unix_nano, span.end_time_unix_nano = 10**18 + i, 10**18 + i + 10**9
        assert isinstance(made["attributes"], dict)
        for key, value in made["attributes"].items():
            any_value = span.attributes.add(key=key).value
            if isinstance(value, str):
                any_value.string_value = value
            elif isinstance(value, int):
                any_value.int_value = value
            else:
                any_value.double_value = value
    data = json_format.MessageToDict(request)
    for span_data in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId", "parentSpanId"):
            span_data[key] = base64.b64decode(span_data[key]).hex()
    return request.SerializeToString(), json.dumps(data).encode()


BODIES: dict[str, Callable[[], tuple[bytes, str]]] = {
    "protobuf: one span, 2M empty events": lambda: (_in_span(_fill(b"\x5a\x00")), PROTOBUF),
    "protobuf: one span, 2M empty attributes": lambda: (_in_span(_fill(b"\x4a\x00")), PROTOBUF),
    "protobuf: one attribute, an array of 2M values": lambda: (
        _in_span(_ld(9, _ld(2, _ld(5, _fill(b"\x0a\x00", LIMIT - 96))))),
        PROTOBUF,
    ),
    "protobuf: a resource's entity, 2M id keys": lambda: (
        _ld(1, _ld(1, _ld(3, _fill(b"\x1a\x00", LIMIT - 96)))),
        PROTOBUF,
    ),
    "protobuf: one span, 2M kind fields": lambda: (_in_span(_fill(b"\x30\x01")), PROTOBUF),
    "protobuf: arrays nested 100,000 deep": lambda: (_nested_protobuf(100_000), PROTOBUF),
    "protobuf: one span, 524k empty events (1 MiB)": lambda: (
        _in_span(_fill(b"\x5a\x00", 2 * (BOUND + 1) * 64 - 16)),
        PROTOBUF,
    ),
    "protobuf: 6,600 vLLM spans (4 MiB, real)": lambda: (_real(6_600)[0], PROTOBUF),
    "protobuf: 8,192 vLLM spans (5 MiB, real)": lambda: (_real(BOUND)[0], PROTOBUF),
    "json: one span, 520k empty events": lambda: (
        _json_export(_json_span('"events":[' + ",".join(["{}"] * 520_000) + "]")),
        JSON,
    ),
    "json: one span, 1.4M empty events": lambda: (
        _json_export(_json_span('"events":[' + ",".join(["{}"] * (LIMIT // 3 - 40)) + "]")),
        JSON,
    ),
    "json: one span, 190k empty attributes": lambda: (
        _json_export(
            _json_span('"attributes":[' + ",".join(['{"key":"","value":{}}'] * 190_000) + "]")
        ),
        JSON,
    ),
    "json: 800k short strings": lambda: (
        b'{"resourceSpans":[],"x":[' + b",".join([b'"ab"'] * (LIMIT // 5 - 8)) + b"]}",
        JSON,
    ),
    "json: arrays nested 100,000 deep": lambda: (
        _json_export(
            _json_span(
                '"attributes":[{"key":"a","value":'
                + '{"arrayValue":{"values":[' * 100_000
                + "{}"
                + "]}}" * 100_000
                + "}]"
            )
        ),
        JSON,
    ),
    "json: 3,350 vLLM spans (4 MiB, real)": lambda: (_real(3_350)[1], JSON),
    "json: 8,192 vLLM spans (10 MiB, real)": lambda: (_real(BOUND)[1], JSON),
}


def _peak_kib() -> int:
    """This process's peak RSS: Linux's ``VmHWM`` (``ru_maxrss`` would start at the RSS of the
    process that forked it)."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1])


def one(path: str, content_type: str) -> None:
    """Decode the body in ``path`` in this process; print its answer, MiB grown and seconds."""
    from aprof._otel.spans import BodyError, decode

    with open(path, "rb") as file:
        body = file.read()
    with contextlib.suppress(BodyError):
        decode(b"{}", JSON, 1)  # what decode imports, before the measure
    before = _peak_kib()
    start = time.perf_counter()
    try:
        answer = f"ok ({len(decode(body, content_type, BOUND))} spans)"
    except BodyError as exc:
        answer = str(exc.status)
    seconds = time.perf_counter() - start
    grown = (_peak_kib() - before) / 1024
    print(json.dumps([answer, grown, seconds]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", nargs=2, help="decode this file here (the child's side)")
    args = parser.parse_args()
    if args.one:
        one(*args.one)
        return
    print(f"{'body':48} {'bytes':>10} {'answer':>16} {'MiB':>7} {'s':>7}")
    with tempfile.TemporaryDirectory() as temp:
        path = Path(temp) / "body"
        for name, make in BODIES.items():
            body, content_type = make()
            path.write_bytes(body)
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(path), content_type],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if out.returncode:
                print(f"{name:48} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            answer, grown, seconds = json.loads(out.stdout)
            print(f"{name:48} {len(body):>10,} {answer:>16} {grown:>7.1f} {seconds:>7.3f}")


if __name__ == "__main__":
    main()
