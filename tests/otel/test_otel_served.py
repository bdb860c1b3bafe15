"""Each request as its server told it (``aprof._otel.served``): SGLang's request spans as a real
SGLang 0.5.23 sent them (``data/``: step 1 of ``e2e_sglang``'s run, four requests ``s1-r0`` to
``s1-r3`` to replica 0, each sent with ``req.traceparent`` and ``req.tracestate``), vLLM's
latency attributes, and files a hostile writer made."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aprof._otel import read_step, served
from aprof._otel.served import replica_of
from aprof._timeline.recorder import span_id_of

SGLANG = Path(__file__).parent / "data" / "sglang-0.5.23.step_1.spans.jsonl"


def _sglang() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SGLANG.read_text().splitlines()]


def test_sglangs_request_span_is_found_below_the_clients_with_its_stages_as_phases() -> None:
    spans = _sglang()
    requests, skipped = served(spans)
    assert skipped == 0  # every span is a request's or below one
    assert sorted(requests) == sorted(span_id_of(f"s1-r{i}") for i in range(4))
    for request in requests.values():
        assert request.name.startswith(" Req ")  # SGLang's root span of a request
        assert request.replica == 0
        # Its stages at their own times: waiting, one prefill, one decode, in order.
        assert [p.name for p in request.phases] == ["queued", "prefill", "decode"]
        for before, after in zip(request.phases, request.phases[1:], strict=False):
            assert before.end_ns <= after.begin_ns
        assert all(
            request.begin_ns <= p.begin_ns <= p.end_ns <= request.end_ns for p in request.phases
        )
        # SGLang's own e2e attribute, and its decode agrees with its decode_forward stage.
        assert request.e2e_s == request.attributes["gen_ai.latency.e2e"]
        decode = request.seconds("decode")
        assert decode is not None
        assert decode == pytest.approx(
            request.attributes["gen_ai.latency.time_in_model_decode"], rel=0.05
        )


def test_vllms_phases_are_laid_end_to_end_from_its_latency_attributes() -> None:
    span = {
        "trace_id": "a" * 32,
        "span_id": "1" * 16,
        "parent_span_id": "2" * 16,
        "name": "llm_request",
        "trace_state": "other=x,aprof=r3",
        "start_ns": 1_000,
        "end_ns": 10_000,
        "attributes": {
            "gen_ai.latency.time_in_queue": 1e-6,
            "gen_ai.latency.time_in_model_prefill": 2e-6,
            "gen_ai.latency.time_in_model_decode": 60.0,  # longer than the span: cut at its end
            "gen_ai.latency.e2e": 9e-6,
        },
    }
    (request,) = served([span])[0].values()
    assert request.replica == 3
    assert [(p.name, p.begin_ns, p.end_ns) for p in request.phases] == [
        ("queued", 1_000, 2_000),
        ("prefill", 2_000, 4_000),
        ("decode", 4_000, 10_000),
    ]
    assert request.e2e_s == 9e-6


def test_what_is_not_a_span_of_a_request_is_counted_and_a_cycle_ends() -> None:
    good = {"span_id": "1" * 16, "parent_span_id": "9" * 16, "start_ns": 0, "end_ns": 5}
    cycle_a = {"span_id": "a" * 16, "parent_span_id": "b" * 16, "start_ns": 0, "end_ns": 5}
    cycle_b = {**cycle_a, "span_id": "b" * 16, "parent_span_id": "a" * 16}
    hostile: list[dict[str, Any]] = [
        good,
        {**good, "span_id": None},
        {**good, "span_id": "2" * 16, "start_ns": 9, "end_ns": 3},  # ends before it begins
        {**good, "span_id": "3" * 16, "start_ns": True},
        {**good, "span_id": "4" * 16, "parent_span_id": None},  # no parent
        {**good, "span_id": "5" * 16, "attributes": {"gen_ai.latency.time_in_queue": 1e309}},
        cycle_a,
        cycle_b,
    ]
    requests, skipped = served(hostile)
    assert skipped == 4
    # "5…" has the same parent as "1…": the first one is the request's; the cycle has no top.
    assert list(requests) == ["9" * 16]
    assert requests["9" * 16].phases == ()


@given(st.text(max_size=40))
def test_a_tracestate_names_a_replica_only_in_aprofs_member(value: str) -> None:
    found = replica_of(value)
    assert found is None or any(m.strip().startswith("aprof=r") for m in value.split(","))
    assert replica_of(f"{value.replace(',', '')}x=1,aprof=r12") == 12
    prefixed = replica_of(f"aprof=r{value}")
    assert prefixed is None or 0 <= prefixed < 2**63


def test_a_tracestate_member_that_is_not_a_small_ascii_number_names_no_replica() -> None:
    assert replica_of("aprof=r12,x=1") == 12
    assert replica_of(f"aprof=r{2**63 - 1}") == 2**63 - 1
    for value in ("aprof=12", "aprof=r", "aprof=r²", "aprof=r-1", f"aprof=r{2**63}", None, 3):
        assert replica_of(value) is None, value


def test_the_one_reader_skips_lines_that_are_not_objects(tmp_path: Path) -> None:
    folder = tmp_path / "otel"
    folder.mkdir()
    (folder / "step_1.spans.jsonl").write_text(SGLANG.read_text() + "[]\nnot json\n")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        found = read_step(fd, 1)
        assert read_step(fd, 2) is None
    finally:
        os.close(fd)
    assert found is not None
    assert (found.shown, len(found.spans), found.bad) == ("otel/step_1.spans.jsonl", 96, 2)
