"""``aprof export otlp``: a run's own spans through the OpenTelemetry SDK's OTLP/HTTP exporter
into a local receiver (aprof's own): every span arrives once, with its parent, on its step's
trace, each request with the span id its trace context carried."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._config import OtelConfig
from aprof._otel import OtelReceiver
from aprof._otel.export import traces_url
from aprof._timeline.recorder import span_id_of
from aprof.cli import main
from aprof.testing import RecordingTarget
from servers.process import free_port

MakeConfig = Callable[..., aprof.ProfilerConfig]


async def _run(make_config: MakeConfig) -> Path:
    """Two steps, step 2 profiled: in each a turn holding a request, then a trainer stage."""
    cfg = make_config(global_profiler={"steps": [2]}, rollout={"forward_steps": None})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in (1, 2):
            async with prof.step(n):
                async with prof.span("turn", turn=0), prof.request(replica=0, request_id=f"r{n}"):
                    pass
                with prof.stage("update_actor"):
                    pass
    return prof.save_path


async def _export(save_path: Path, into: Path, *extra: str) -> list[dict[str, Any]]:
    """``aprof export otlp`` (off the event loop: the SDK's exporter blocks) into a receiver
    below ``into``; every span it filed."""
    salt = aprof.load_manifest(save_path).trace_salt
    assert salt is not None
    receiver = OtelReceiver(
        OtelConfig(receive=True), root=into, salt=salt, on_taken=lambda spans, dropped: None
    )
    for n in (1, 2):  # the run's steps: the receiver takes the spans of steps begun
        receiver.step_began(n, 0)
    endpoint = await receiver.start()
    try:
        argv = ["export", "otlp", str(save_path), "--endpoint", endpoint, *extra]
        assert await asyncio.to_thread(main, argv) == 0
    finally:
        await receiver.aclose()
    return [
        {**json.loads(line), "file": path.name}
        for path in sorted((into / "otel").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


async def test_every_span_arrives_once_with_its_parent(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    save_path = await _run(make_config)
    spans = await _export(save_path, tmp_path / "received")
    assert len({s["span_id"] for s in spans}) == len(spans)  # each once
    salt = aprof.load_manifest(save_path).trace_salt
    for n in (1, 2):
        mine = {s["name"]: s for s in spans if s["file"] == f"step_{n}.spans.jsonl"}
        expected = {f"step {n}", "turn", "request replica_0", "update_actor"}
        assert set(mine) == expected | ({"capture replica_0"} if n == 2 else set())
        root = mine[f"step {n}"]
        assert root["parent_span_id"] is None and root["trace_id"] == f"{salt}{n:016x}"
        assert all(
            s["parent_span_id"] == root["span_id"] and s["trace_id"] == root["trace_id"]
            for s in mine.values()
            if s is not root
        )
        request = mine["request replica_0"]
        assert request["span_id"] == span_id_of(f"r{n}")  # what its traceparent carried
        assert request["kind"] == 3  # CLIENT
        assert request["attributes"]["request_id"] == f"r{n}"
        assert mine["update_actor"]["attributes"]["aprof"] == "stage"
        assert root["start_ns"] <= request["start_ns"] <= request["end_ns"] <= root["end_ns"]
    assert {s["file"] for s in spans} == {"step_1.spans.jsonl", "step_2.spans.jsonl"}


async def test_only_the_steps_asked_for_are_sent(make_config: MakeConfig, tmp_path: Path) -> None:
    save_path = await _run(make_config)
    spans = await _export(save_path, tmp_path / "received", "--steps", "2")
    assert {s["file"] for s in spans} == {"step_2.spans.jsonl"}


async def test_no_run_or_no_endpoint_is_one_line(
    make_config: MakeConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["export", "otlp", str(tmp_path / "none"), "--endpoint", nowhere]) == 1
    assert capsys.readouterr().err.startswith("aprof export: ")
    save_path = await _run(make_config)
    argv = ["export", "otlp", str(save_path), "--endpoint", nowhere, "--timeout", "1"]
    assert await asyncio.to_thread(main, argv) == 1
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    assert line.startswith("aprof export: ") and "did not take" in line


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("ftp://user:secret@127.0.0.1/v1/traces", "ftp:// is not supported"),
        ("127.0.0.1:4318", "is not supported"),
        ("http:///v1/traces", "no host"),
    ],
)
def test_an_endpoint_that_is_not_http_is_named_without_its_password(
    endpoint: str, said: str
) -> None:
    with pytest.raises(ValueError, match=said) as caught:
        traces_url(endpoint)
    assert "secret" not in str(caught.value)
    assert caught.value.args[0].startswith("endpoint ")  # one line naming what was wrong


def test_the_traces_path_is_added_once() -> None:
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("https://h/v1/traces") == "https://h/v1/traces"
