"""Span bombs at a real run's OTLP receiver: exports of millions of empty spans (protobuf and
JSON), of one span holding millions of empty events, attributes or array values, of a million
strings, of values nested far deeper than protobuf takes, spans naming steps the run never
began (far ahead, 2**62, 2**64 - 2, 0) and trace ids of the wrong length. Each is answered
with a status an OTLP exporter does not send again (413 for a bomb, 400 for the nesting),
nothing escapes into the run, the manifest loads, no step the run did not begin gets a file,
and the steps begun keep taking their spans after every bomb."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import aprof
from faults.common import check_outside, load, snapshot
from faults.tally import Faults

pytestmark = pytest.mark.faults

MakeConfig = Callable[..., aprof.ProfilerConfig]
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
RETRIED = {429, 502, 503, 504}
"""What OTLP/HTTP exporters send again."""


def _ld(field: int, payload: bytes) -> bytes:
    n, head = len(payload), bytearray([field << 3 | 2])
    while n >= 0x80:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head) + payload


def _spans(trace_ids: list[bytes]) -> bytes:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i, trace_id in enumerate(trace_ids):
        span = scope.spans.add()
        span.trace_id, span.span_id, span.name = trace_id, (i + 1).to_bytes(8, "big"), "bomb"
    return request.SerializeToString()


def _nested(levels: int) -> bytes:
    """A span's one attribute: an array holding an array ... ``levels`` deep."""
    value = b""
    for _ in range(levels):
        value = _ld(5, _ld(1, value))  # AnyValue.array_value, ArrayValue.values
    return _ld(9, _ld(2, value))


def _bombs(salt: str, limit: int) -> list[tuple[str, bytes, str, int | None]]:
    """(what, body, content type, the answer it gets: ``None`` for 200) of each bomb, each
    under ``limit`` bytes."""
    run = bytes.fromhex(salt)
    far = [2**62, 2**64 - 2, 0, 10**6, 5]
    half = (limit - 64) // 2

    def in_span(fields: bytes) -> bytes:
        return _ld(1, _ld(2, _ld(2, fields)))

    def json_span(fields: bytes) -> bytes:
        return b'{"resourceSpans":[{"scopeSpans":[{"spans":[{' + fields + b"}]}]}]}"

    return [
        ("protobuf spans", _ld(1, _ld(2, b"\x12\x00" * half)), PROTOBUF, 413),
        ("protobuf resources", b"\x0a\x00" * half, PROTOBUF, 413),
        ("protobuf events", in_span(b"\x5a\x00" * half), PROTOBUF, 413),
        ("protobuf attributes", in_span(b"\x4a\x00" * half), PROTOBUF, 413),
        (
            "protobuf array values",
            in_span(_ld(9, _ld(2, _ld(5, b"\x0a\x00" * half)))),
            PROTOBUF,
            413,
        ),
        ("protobuf nesting", in_span(_nested(5_000)), PROTOBUF, 400),
        (
            "json spans",
            b'{"resourceSpans":[{"scopeSpans":[{"spans":['
            + b"{}," * ((limit - 60) // 3)
            + b"{}]}]}]}",
            JSON,
            413,
        ),
        (
            "json events",
            json_span(b'"events":[' + b"{}," * ((limit - 128) // 3) + b"{}]"),
            JSON,
            413,
        ),
        ("json arrays", b'{"x":[' + b"[]," * ((limit - 20) // 3) + b"[]]}", JSON, 413),
        ("json strings", b'{"x":[' + b'"ab",' * ((limit - 64) // 5) + b'"ab"]}', JSON, 413),
        (
            "json nesting",
            json_span(b'"attributes":[{"key":"a","value":' + b"[" * 50_000 + b"]" * 50_000 + b"}]"),
            JSON,
            400,
        ),
        ("far steps", _spans([run + s.to_bytes(8, "big") for s in far]), PROTOBUF, None),
        (
            "wrong length ids",
            _spans([run + b"\x00" * 9, run[:7], b"\xff" * 17, b""]),
            PROTOBUF,
            None,
        ),
    ]


async def _post(http: aiohttp.ClientSession, url: str, body: bytes, content_type: str) -> int:
    headers = {"Content-Type": content_type}
    async with http.post(f"{url}/v1/traces", data=body, headers=headers) as answer:
        await answer.read()
        return answer.status


async def test_span_bombs_cost_the_run_nothing(
    make_config: MakeConfig, tmp_path: Path, faults: Faults
) -> None:
    cfg = make_config(otel={"receive": True})
    before = snapshot(tmp_path, exclude=[cfg.global_profiler.save_path])
    escaped: list[str] = []
    statuses: dict[str, int] = {}
    async with aprof.Profiler(cfg) as prof, aiohttp.ClientSession() as http:
        url, salt = prof.otel_endpoint, prof.manifest.trace_salt
        assert url is not None and salt is not None
        for n in (1, 2, 3):
            async with prof.step(n):
                pass
        good = _spans([bytes.fromhex(salt) + (3).to_bytes(8, "big")])
        bombs = _bombs(salt, cfg.otel.max_body_bytes)
        for what, body, content_type, _ in bombs:
            assert len(body) <= cfg.otel.max_body_bytes, what
            faults.count("span_bombs", 1)
            try:
                statuses[what] = await _post(http, url, body, content_type)
                # The steps begun still take their spans after each bomb.
                assert await _post(http, url, good, PROTOBUF) == 200
            except Exception as exc:  # anything here is the receiver failing the run
                escaped.append(f"{what}: {type(exc).__name__}: {exc}")
    faults.check("escaped", not escaped, "; ".join(escaped))
    expected = {what: status or 200 for what, _, _, status in bombs}
    faults.check(
        "escaped",
        statuses == expected and not RETRIED & set(statuses.values()),
        f"bombs answered {statuses}, not {expected}: never a status exporters send again",
    )
    check_outside(faults, before, snapshot(tmp_path, exclude=[cfg.global_profiler.save_path]))
    manifest = load(faults, prof.save_path)
    files = {p.name for p in (prof.save_path / "otel").iterdir()}
    faults.check(
        "escaped",
        files <= {"step_3.spans.jsonl", "other.spans.jsonl"},
        f"files of steps the run did not begin: {sorted(files)}",
    )
    step_3 = (prof.save_path / "otel" / "step_3.spans.jsonl").read_text().splitlines()
    faults.check(
        "escaped",
        [json.loads(line)["name"] for line in step_3] == ["bomb"] * len(bombs),
        f"step 3 kept {len(step_3)} of its spans",
    )
    faults.check(
        "unloadable",
        manifest is not None
        and manifest.otel is not None
        and manifest.otel.spans == len(step_3) + 4
        and manifest.otel.dropped == 5,
        f"the manifest's otel counts: {manifest.otel if manifest else None}",
    )
    faults.assert_nothing_lost()
