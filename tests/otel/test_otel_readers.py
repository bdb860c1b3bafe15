"""The servers' own spans of requests (received over OTLP) read back: ``aprof merge`` nests
each under its request, with its queued, prefill and decode phases, on the merged step's one
clock; ``aprof report`` gives each step's server side and its slowest requests' breakdown."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import aprof
from aprof._report import accounting, collect, render
from aprof._report.document import document
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]
PHASES_S = {"queue": 2e-6, "model_prefill": 3e-6, "model_decode": 4e-6}
"""Each request's phases on the server: 9 µs of its 10 µs span, which begins 50 µs into the
request (the export, sent inside the request, takes longer than that)."""


def _server_span(traceparent: str, tracestate: str, begin_ns: int, end_ns: int) -> bytes:
    """What a vLLM server exports for one request: ``llm_request``, the child of the
    client's span (with its ``tracestate``), with its phases' latencies (seconds)."""
    _, trace_id, parent, _ = traceparent.split("-")
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.parent_span_id = bytes.fromhex(trace_id), bytes.fromhex(parent)
    span.trace_state = tracestate
    span.span_id = bytes.fromhex(parent[::-1])
    span.name, span.kind = "llm_request", 2
    span.start_time_unix_nano, span.end_time_unix_nano = begin_ns, end_ns
    for phase, seconds in PHASES_S.items():
        kv = span.attributes.add()
        kv.key = f"gen_ai.latency.time_in_{phase}"
        kv.value.double_value = seconds
    return request.SerializeToString()


async def _run(make_config: MakeConfig, collector: Path | None = None) -> Path:
    """Steps 1 and 2 profiled; in step 1 three requests (to replicas 0, 1, 1) whose server
    exports its span of each (the export sent from inside the request, which outlasts the
    span): to the run's receiver, or, given ``collector``, as a collector's file exporter
    writes it there."""
    cfg = make_config(
        global_profiler={"steps": [1, 2]},
        otel={"receive": collector is None},
        rollout={"forward_steps": None},
    )
    async with aprof.Profiler(cfg) as prof, aiohttp.ClientSession() as http:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        prof.add_target(RecordingTarget("replica_1", replica=1))
        async with prof.step(1):
            for i in range(3):
                async with prof.request(replica=min(i, 1), request_id=f"r{i}") as req:
                    assert req.traceparent is not None and req.tracestate is not None
                    began = time.time_ns() + 50_000
                    body = _server_span(req.traceparent, req.tracestate, began, began + 10_000)
                    if collector is not None:
                        with (collector / "traces.jsonl").open("a") as f:
                            f.write(_as_otlp_json(body) + "\n")
                        continue
                    url = f"{prof.otel_endpoint}/v1/traces"
                    headers = {"Content-Type": "application/x-protobuf"}
                    async with http.post(url, data=body, headers=headers) as answer:
                        assert answer.status == 200
        async with prof.step(2), prof.request(replica=0, request_id="other"):
            pass  # a step without server spans merges as before
    return prof.save_path


def _as_otlp_json(body: bytes) -> str:
    """An export in OTLP's JSON (ids in hex), as a collector's file exporter writes it."""
    data = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    for resource in data["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(data)


async def test_each_servers_span_is_nested_under_its_request(make_config: MakeConfig) -> None:
    save_path = await _run(make_config)
    one, two = aprof.merge(save_path)
    assert "otel/step_1.spans.jsonl" in one.others
    assert not [n for n in one.notes if n.startswith("otel/")]
    with gzip.open(one.path, "rt") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    lanes = {
        e["args"]["request_id"]: e
        for e in events
        if e.get("cat") == "aprof.link" and e["ph"] == "X"
    }
    assert sorted(lanes) == ["r0", "r1", "r2"]
    served = [e for e in events if e.get("cat") == "aprof.server"]
    for request_id, lane in lanes.items():
        mine = [  # a lane holds requests one after another
            e
            for e in served
            if (e["pid"], e["tid"]) == (lane["pid"], lane["tid"])
            and lane["ts"] <= e["ts"] <= lane["ts"] + lane["dur"]
        ]
        span, *phases = sorted(mine, key=lambda e: (e["ts"], -e["dur"]))
        assert (span["name"], span["args"]["request_id"]) == ("llm_request", request_id)
        # Within its request's slice, and its phases one after another within it.
        assert lane["ts"] <= span["ts"] and span["ts"] + span["dur"] <= lane["ts"] + lane["dur"]
        assert [p["name"] for p in phases] == ["queued", "prefill", "decode"]
        assert span["dur"] == 10.0
        assert [p["dur"] for p in phases] == [2.0, 3.0, 4.0]
        assert phases[0]["ts"] == span["ts"]
        for a, b in itertools.pairwise(phases):
            assert b["ts"] == round(a["ts"] + a["dur"], 3)
    assert not [n for n in two.others if n.startswith("otel/")]


async def test_the_report_gives_each_steps_server_side(make_config: MakeConfig) -> None:
    save_path = await _run(make_config)
    found = accounting(save_path)
    step = {s["step"]: s for s in document(found)["steps"]}
    side = step[1]["server"]
    assert side["spans"] == 3 and step[2]["server"] is None
    assert side["queued_s"]["p50"] == 2e-6 and side["prefill_s"]["max"] == 3e-6
    assert side["decode_s"]["sum"] == pytest.approx(12e-6)
    assert side["e2e_s"]["max"] == 10e-6  # no e2e attribute: the span's length
    # Per replica, as each request's tracestate said (and its server's span carried back).
    assert [(r["replica"], r["spans"]) for r in side["replicas"]] == [(0, 1), (1, 2)]
    assert side["replicas"][1]["decode_s"]["sum"] == pytest.approx(8e-6)
    slowest = {s["request_id"]: s for s in side["slowest"]}
    assert sorted(slowest) == ["r0", "r1", "r2"]
    r1 = slowest["r1"]["server"]
    assert {k: r1[k] for k in ("queued_s", "prefill_s", "decode_s", "e2e_s")} == {
        "queued_s": 2e-6,
        "prefill_s": 3e-6,
        "decode_s": 4e-6,
        "e2e_s": 10e-6,
    }
    latency = next(s.latency_s for s in found.accounts[0].slowest if s.request_id == "r1")
    assert r1["gap_s"] == pytest.approx(latency - 10e-6)
    text = render(collect(save_path))
    assert "server      n=3     queued p50 0.00 ms  prefill p50 0.00 ms" in text
    assert "  replica_1 n=2 queued p50 0.00 ms" in text
    assert "slowest r0: queued 0.00 ms, prefill 0.00 ms, decode 0.00 ms" in text


async def test_spans_a_users_collector_wrote_are_merged_too(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    collector = tmp_path / "collector"
    collector.mkdir()
    save_path = await _run(make_config, collector)
    with (collector / "traces.jsonl").open("a") as f:
        f.write("not json\n")
    (one, _) = aprof.merge(save_path, otel=collector)
    assert f"{collector / 'traces.jsonl'}: 1 line(s) not an OTLP JSON export" in one.notes
    with gzip.open(one.path, "rt") as f:
        events = json.load(f)["traceEvents"]
    served = [e for e in events if e.get("cat") == "aprof.server"]
    assert sorted(e["args"]["request_id"] for e in served if e["name"] == "llm_request") == [
        "r0",
        "r1",
        "r2",
    ]
