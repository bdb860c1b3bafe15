"""The run's OTLP/HTTP receiver: fed by the OpenTelemetry SDK's own exporter (protobuf), by
OTLP JSON, and by hostile bodies; spans filed by the step their trace id names, bounded,
nothing written outside ``save_path``."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from structlog.testing import capture_logs

import aprof
from aprof._config import OtelConfig
from aprof._otel import OtelReceiver, receiver, served
from aprof._timeline.recorder import span_id_of

MakeConfig = Callable[..., aprof.ProfilerConfig]
PROTOBUF = "application/x-protobuf"
SPAN_ID = "00f067aa0ba902b7"


def _traceparent(prof: aprof.Profiler, step: int | None, span_id: str = SPAN_ID) -> str:
    salt = prof.manifest.trace_salt
    assert salt is not None
    return f"00-{salt}{'f' * 16 if step is None else f'{step:016x}'}-{span_id}-01"


def _spans(prof: aprof.Profiler, name: str) -> list[dict[str, Any]]:
    path = prof.save_path / "otel" / name
    return [json.loads(line) for line in path.read_text().splitlines()]


def _export(traceparent: str, count: int = 1, name: str = "llm_request") -> bytes:
    """An OTLP export of ``count`` server spans, children of ``traceparent``'s span."""
    _, trace_id, parent, _ = traceparent.split("-")
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    kv = resource.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "vllm"
    scope = resource.scope_spans.add()
    for i in range(count):
        span = scope.spans.add()
        span.trace_id = bytes.fromhex(trace_id)
        span.span_id = (i + 1).to_bytes(8, "big")
        span.parent_span_id = bytes.fromhex(parent)
        span.name = name
        span.start_time_unix_nano, span.end_time_unix_nano = 1_000, 2_000 + i
        attr = span.attributes.add()
        attr.key, attr.value.double_value = "gen_ai.latency.time_in_queue", 0.25
    return request.SerializeToString()


async def _post(url: str, body: bytes, content_type: str = PROTOBUF) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/traces", data=body, headers={"Content-Type": content_type}) as r,
    ):
        return r.status, await r.read()


async def test_the_sdks_exporter_files_a_span_under_its_step(make_config: MakeConfig) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    cfg = make_config(otel={"receive": True})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None and url.startswith("http://127.0.0.1:")
        async with prof.step(3):  # the receiver takes the spans of steps begun
            pass
        traceparent = _traceparent(prof, 3)

        def serve() -> None:
            """What an engine does: a SERVER span from the client's trace context, exported
            by the SDK's OTLP/HTTP exporter (blocking, so off the event loop)."""
            provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
            exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=10)
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
            tracer = provider.get_tracer("test")
            span = tracer.start_span("llm_request", context, kind=SpanKind.SERVER)
            span.set_attribute("gen_ai.request.id", "s3-t0")
            span.set_attribute("gen_ai.usage.completion_tokens", 7)
            span.end()
            provider.shutdown()

        await asyncio.to_thread(serve)
        assert prof.manifest.otel is not None
        assert (prof.manifest.otel.spans, prof.manifest.otel.dropped) == (1, 0)

    (span,) = _spans(prof, "step_3.spans.jsonl")
    assert span["trace_id"] == traceparent.split("-")[1]
    assert span["parent_span_id"] == SPAN_ID
    assert (span["name"], span["kind"], span["service"]) == ("llm_request", 2, "vllm")
    assert span["attributes"] == {"gen_ai.request.id": "s3-t0", "gen_ai.usage.completion_tokens": 7}
    assert 0 < span["start_ns"] <= span["end_ns"]
    manifest = aprof.load_manifest(prof.save_path)
    assert manifest.otel is not None and manifest.otel.endpoint == url
    assert (manifest.otel.spans, manifest.trace_salt) == (1, prof.manifest.trace_salt)


async def test_json_bodies_other_traces_and_spans_outside_steps(make_config: MakeConfig) -> None:
    cfg = make_config(otel={"receive": True})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        request = ExportTraceServiceRequest.FromString(_export(_traceparent(prof, None)))
        data = json_format.MessageToDict(request)
        for span in data["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId", "parentSpanId"):  # OTLP JSON: hex, not base64
                span[key] = base64.b64decode(span[key]).hex()
        assert await _post(url, json.dumps(data).encode(), "application/json") == (200, b"{}")
        other = "00-" + "ab" * 16 + "-" + SPAN_ID + "-01"
        status, answer = await _post(url, _export(other, 2))
        assert status == 200
        assert not ExportTraceServiceResponse.FromString(answer).HasField("partial_success")

    (outside,) = _spans(prof, "no_step.spans.jsonl")
    assert outside["attributes"] == {"gen_ai.latency.time_in_queue": 0.25}
    assert outside["parent_span_id"] == SPAN_ID
    assert len(_spans(prof, "other.spans.jsonl")) == 2


def _without_context(start_ns: int, request_id: str | None) -> bytes:
    """A server's span sent without trace context (a root of a trace of its own), naming its
    request when ``request_id`` is given, as vLLM does for a call from verl."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = bytes.fromhex("cd" * 16), bytes.fromhex("0a" * 8)
    span.name = "llm_request"
    span.start_time_unix_nano, span.end_time_unix_nano = start_ns, start_ns + 1_000
    if request_id is not None:
        attr = span.attributes.add()
        attr.key, attr.value.string_value = "gen_ai.request.id", request_id
    return request.SerializeToString()


async def test_a_span_without_trace_context_naming_its_request_goes_to_its_step(
    make_config: MakeConfig,
) -> None:
    """Filed under the step begun last before it started; before any step, or naming no
    request, with the other traces."""
    cfg = make_config(otel={"receive": True})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        before = time.time_ns()
        async with prof.step(1):
            in_one = time.time_ns()
        async with prof.step(2):
            in_two = time.time_ns()
        for body in (
            _without_context(before, "early"),
            _without_context(in_one, "s1"),
            _without_context(in_two, "s2"),
            _without_context(in_two, None),
        ):
            assert (await _post(url, body))[0] == 200

    assert [s["attributes"]["gen_ai.request.id"] for s in _spans(prof, "step_1.spans.jsonl")] == [
        "s1"
    ]
    (two,) = _spans(prof, "step_2.spans.jsonl")
    assert two["attributes"] == {"gen_ai.request.id": "s2"} and two["parent_span_id"] is None
    assert [s["attributes"] for s in _spans(prof, "other.spans.jsonl")] == [
        {"gen_ai.request.id": "early"},
        {},
    ]
    requests, skipped = served([two])
    assert (list(requests), skipped) == ([span_id_of("s2")], 0)  # the request it names


async def test_spans_past_a_steps_cap_are_counted_and_said(make_config: MakeConfig) -> None:
    cfg = make_config(otel={"receive": True, "max_spans_per_step": 2})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        async with prof.step(1):
            pass
        status, answer = await _post(url, _export(_traceparent(prof, 1), 5))
        assert status == 200
        partial = ExportTraceServiceResponse.FromString(answer).partial_success
        assert partial.rejected_spans == 3 and "max_spans_per_step" in partial.error_message
    assert len(_spans(prof, "step_1.spans.jsonl")) == 2
    manifest = aprof.load_manifest(prof.save_path)
    assert manifest.otel is not None and (manifest.otel.spans, manifest.otel.dropped) == (2, 3)


async def test_hostile_bodies_are_answered_and_cost_nothing(make_config: MakeConfig) -> None:
    cfg = make_config(otel={"receive": True, "max_body_bytes": 4096})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        async with prof.step(1):
            pass
        good = _export(_traceparent(prof, 1))
        assert (await _post(url, b"x" * 5000))[0] == 413
        assert (await _post(url, good, "text/plain"))[0] == 415
        assert (await _post(url, b"\xff\xff\xff garbage"))[0] == 400
        assert (await _post(url, good[: len(good) // 2]))[0] == 400  # cut mid-span
        assert (await _post(url, b"[1, 2]", "application/json"))[0] == 400
        bad_id = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}
        assert (await _post(url, json.dumps(bad_id).encode(), "application/json"))[0] == 400
        # A flood: every export is answered, taken or told to come back (503).
        answers = await asyncio.gather(*(_post(url, good) for _ in range(40)))
        assert {status for status, _ in answers} <= {200, 503}
        taken = sum(status == 200 for status, _ in answers)
        assert taken >= 1
        assert prof.manifest.otel is not None and prof.manifest.otel.spans == taken
    assert len(_spans(prof, "step_1.spans.jsonl")) == taken


async def test_nothing_is_written_through_a_link(make_config: MakeConfig, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    cfg = make_config(otel={"receive": True})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        async with prof.step(1):
            pass
        (prof.save_path / "otel").symlink_to(outside)  # after the receiver started
        with capture_logs() as logs:
            status, answer = await _post(url, _export(_traceparent(prof, 1)))
        assert status == 200
        assert ExportTraceServiceResponse.FromString(answer).partial_success.rejected_spans == 1
    assert list(outside.iterdir()) == []
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["otel spans not written"]
    manifest = aprof.load_manifest(prof.save_path)
    assert manifest.otel is not None and (manifest.otel.spans, manifest.otel.dropped) == (0, 1)


async def test_receiving_is_off_by_default(make_config: MakeConfig) -> None:
    async with aprof.Profiler(make_config()) as prof:
        assert prof.otel_endpoint is None
        assert prof.manifest.otel is None
        salt = prof.manifest.trace_salt
        assert salt is not None and len(salt) == 16 and int(salt, 16) != 0
    assert not (prof.save_path / "otel").exists()


async def test_spans_still_on_their_way_as_it_closes_are_kept(tmp_path: Path) -> None:
    """The engines send every 500 ms: the last step's spans arrive after its requests end.
    A receiver that has taken spans keeps listening as it closes until none came for
    ``QUIET_S``."""
    salt = "0123456789abcdef"
    receiver = OtelReceiver(
        OtelConfig(receive=True), root=tmp_path, salt=salt, on_taken=lambda spans, dropped: None
    )
    url = await receiver.start()
    receiver.step_began(1, 0)
    traceparent = f"00-{salt}{1:016x}-{SPAN_ID}-01"
    assert (await _post(url, _export(traceparent)))[0] == 200
    closing = asyncio.create_task(receiver.aclose())
    await asyncio.sleep(0)  # the close runs up to its wait for stragglers
    assert not closing.done()
    assert (await _post(url, _export(traceparent, name="late")))[0] == 200
    await closing
    assert receiver.counts.spans == 2
    lines = (tmp_path / "otel" / "step_1.spans.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["llm_request", "late"]


TOKEN = "an-otel-token,with=odd%chars-0123"
"""Holds the characters OTel's header list format must escape."""


def _bomb(size: int) -> bytes:
    """``size`` zero bytes gzip-compressed, built a MiB at a time (memory flat)."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(stream.compress(zeros) for _ in range(size >> 20)) + stream.flush()


def _sdk_export(url: str, traceparent: str) -> None:
    """What an engine does, its exporter configured by the environment only (blocking)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=10)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    provider.get_tracer("test").start_span("llm_request", context, kind=SpanKind.SERVER).end()
    provider.shutdown()


async def test_an_engine_launched_by_launch_spec_bears_the_receivers_token(
    make_config: MakeConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``otel.token_file``: the receiver asks for the token, and ``launch_spec`` gives it to
    the engine's exporter (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``), which sends gzip here;
    without the environment the export is refused."""
    from servers import launch_spec

    token_file = tmp_path / "otel-token"
    token_file.write_text(TOKEN + "\n")
    cfg = make_config(otel={"receive": True, "token_file": str(token_file)})
    async with aprof.Profiler(cfg) as prof:
        url = prof.otel_endpoint
        assert url is not None
        async with prof.step(1):
            await asyncio.to_thread(_sdk_export, url, _traceparent(prof, 1))  # no token: 401
        spec = launch_spec("vllm", cfg, version="0.11.0", otel_endpoint=url)
        assert spec.env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"].startswith("authorization=Bearer%20")
        for key, value in spec.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
        async with prof.step(2):
            await asyncio.to_thread(_sdk_export, url, _traceparent(prof, 2))
        assert prof.manifest.otel is not None and prof.manifest.otel.spans == 1
    assert [s["name"] for s in _spans(prof, "step_2.spans.jsonl")] == ["llm_request"]
    assert not (prof.save_path / "otel" / "step_1.spans.jsonl").exists()


async def test_an_export_without_the_token_is_refused_on_its_headers(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    token_file = tmp_path / "otel-token"
    token_file.write_text(TOKEN)
    cfg = make_config(otel={"receive": True, "token_file": str(token_file)})
    async with aprof.Profiler(cfg) as prof:
        assert prof.otel_endpoint is not None
        host, port = prof.otel_endpoint.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: 4000000\r\n\r\n"
        )
        async with asyncio.timeout(10):
            answer = await reader.read()  # until the receiver closes the connection
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401")
        assert prof.manifest.otel is not None and prof.manifest.otel.spans == 0


async def test_a_gzip_bomb_is_413_and_a_compressed_export_is_taken(
    make_config: MakeConfig,
) -> None:
    async with aprof.Profiler(make_config(otel={"receive": True})) as prof:
        url = prof.otel_endpoint
        assert url is not None
        headers = {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"}
        async with aiohttp.ClientSession() as session:
            bomb = _bomb(64 << 20)  # 64 MiB inflated, past the 4 MiB of max_body_bytes
            async with session.post(f"{url}/v1/traces", data=bomb, headers=headers) as r:
                assert r.status == 413 and "inflated" in await r.text()
            packed = gzip.compress(_export(_traceparent(prof, 1), 3))
            async with (
                prof.step(1),
                session.post(f"{url}/v1/traces", data=packed, headers=headers) as r,
            ):
                assert r.status == 200
    assert len(_spans(prof, "step_1.spans.jsonl")) == 3


async def test_another_host_without_a_token_is_warned_of(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It still listens (a cluster's engines may need it), and says who may send."""
    monkeypatch.setattr(receiver, "_loopback", lambda host: False)  # no other host in tests
    with capture_logs() as logs:
        async with aprof.Profiler(make_config(otel={"receive": True})) as prof:
            assert prof.otel_endpoint is not None
    warned = [e for e in logs if "otel.token_file" in e["event"]]
    assert len(warned) == 1 and warned[0]["host"] == "127.0.0.1"


def test_loopback_hosts_are_told_apart() -> None:
    assert all(map(receiver._loopback, ["127.0.0.1", "127.8.0.1", "::1", "localhost"]))
    assert not any(map(receiver._loopback, ["0.0.0.0", "10.0.0.1", "::", "example.org"]))
