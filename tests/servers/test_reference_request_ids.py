"""The reference server names the client's request ids (``X-Request-Id``; SGLang's ``rid``)
in the forward steps that serve them, in a real torch trace."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from aprof._merge.flows import request_ids
from servers.reference import ReferenceServer
from servers.reference.engine import MAX_NAMED_IDS, REQUESTS_RECORD, Sequence, _requests_record
from servers.reference.trace_files import load_trace

if TYPE_CHECKING:
    # For annotations only: at run time the name `conftest` may mean tests/conftest.py.
    from conftest import ReferenceFactory

pytest.importorskip("torch")
QUIET = {"activities": ["CPU"], "with_stack": False, "record_shapes": False}
"""SGLang start body fields that keep the trace small."""


async def post(
    http: aiohttp.ClientSession,
    server: ReferenceServer,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> int:
    async with http.post(f"{server.url}{path}", json=body, headers=headers) as response:
        await response.read()
        return response.status


def named_ids(trace: Path) -> dict[int, list[str]]:
    """Per forward step number, the ids its ``requests:`` record names (a record is the
    forward step's when it lies inside it, on its thread)."""
    events = [e for e in load_trace(trace)["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("forward_step#")]
    named: dict[int, list[str]] = {int(e["name"].split("#")[1]): [] for e in steps}
    for record in (e for e in events if e["name"].startswith(REQUESTS_RECORD)):
        (step,) = [
            s
            for s in steps
            if s["tid"] == record["tid"]
            and s["ts"] <= record["ts"]
            and record["ts"] + record["dur"] <= s["ts"] + s["dur"]
        ]
        named[int(step["name"].split("#")[1])] += request_ids(record["name"])
    return named


async def test_vllm_forward_steps_name_the_requests_they_served(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "hello", "max_tokens": 2}
    sent = {
        "traj-7-t0": True,
        "x" * 128: True,  # the longest id named
        "y" * 129: False,  # too long: served, not named
        'quote"d': False,  # Kineto would write the quote unescaped: not named
        "tab\there": False,  # a control character
        "caf\u00e9": False,  # not ASCII: Kineto writes "unknown"
    }
    async with asyncio.timeout(60), reference_server(vllm_version="0.32.0") as server:
        assert server.profiler_dir is not None
        assert await post(http, server, "/start_profile") == 200
        for request_id in sent:
            headers = {"X-Request-Id": request_id}
            assert await post(http, server, "/v1/completions", body, headers) == 200
        assert await post(http, server, "/v1/completions", body) == 200  # no id at all
        assert await post(http, server, "/stop_profile") == 200
    (worker,) = [p for p in server.profiler_dir.glob("*.pt.trace.json.gz") if "async" not in p.name]
    named = named_ids(worker)  # the trace is valid JSON whatever the ids held
    assert len(named) == 2 * (len(sent) + 1)  # a prefill and a decode per request, in turn
    listed = [ids for _, ids in sorted(named.items())]
    expected = [[i] if ok else [] for i, ok in sent.items() for _ in range(2)] + [[], []]
    assert listed == expected


async def test_sglang_generate_names_rid_or_the_header(
    reference_server: ReferenceFactory, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    out = tmp_path / "call"
    start = {"output_dir": str(out), "profile_id": "p1", **QUIET}
    generate = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        assert await post(http, server, "/start_profile", start) == 200
        headers = {"X-Request-Id": "from-header"}
        assert (
            await post(http, server, "/generate", {**generate, "rid": "from-rid"}, headers) == 200
        )
        assert await post(http, server, "/generate", generate, headers) == 200
        assert await post(http, server, "/stop_profile") == 200
    (trace,) = out.iterdir()
    assert named_ids(trace) == {1: ["from-rid"], 2: ["from-header"]}


def test_a_forward_step_names_64_ids_and_counts_the_rest() -> None:
    torch = pytest.importorskip("torch")
    batch = [Sequence(id=str(n), prompt=[1], max_tokens=1, client_id=f"r{n}") for n in range(70)]
    batch.append(Sequence(id="70", prompt=[1], max_tokens=1, client_id="r0"))  # a second prompt
    assert _requests_record(torch, batch) is None  # no profiler records: nothing built
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        name = _requests_record(torch, batch)
    assert name is not None and name.endswith(" (+6 more)")
    assert request_ids(name) == [f"r{n}" for n in range(MAX_NAMED_IDS)]
