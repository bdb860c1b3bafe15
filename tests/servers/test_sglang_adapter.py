"""``servers.SGLangServer`` over real HTTP against the reference server's SGLang dialect.

SGLang itself cannot run on a CPU-only machine; the reference server follows its HTTP
protocol (reference note sglang.md, sections 2-6). Window semantics are driven through
``aprof.Profiler``; protocol details call the adapter directly. Nothing sleeps.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from adapter_steps import STEPS, TIMEOUTS, answered, config, run_steps, window
from conftest import Complete, ReferenceFactory

import aprof
from aprof.testing import assert_windows
from servers import SGLangServer
from servers.reference import Faults, forward_step_numbers


@pytest.fixture
def timeouts() -> aprof.TimeoutsConfig:
    return aprof.TimeoutsConfig(**TIMEOUTS)


async def test_windows_end_on_the_server_and_their_stop_answers_500(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    save = tmp_path / "profile"
    async with asyncio.timeout(120), reference_server(dialect="sglang") as server:
        prof = aprof.Profiler(config(save))
        prof.add_target(SGLangServer(server.url, replica=0))
        await run_steps(prof, server, complete)
    expected = {"state": "done", "stop_reason": "auto_stop", "forward_steps.observed": 4}
    assert_windows(
        prof.manifest,
        [{"step": n, "forward_steps.enforced_by": "server", **expected} for n in STEPS],
    )
    for n in STEPS:
        record = prof.manifest.window(n, "replica_0")
        assert record is not None
        (entry,) = record.files
        assert entry.path.startswith(f"step_{n}/rollout/replica_0/replica_0-step{n}-")
        assert entry.path.endswith("-TP-0.trace.json.gz")
        steps = forward_step_numbers(save / entry.path)
        assert steps == list(range(steps[0], steps[0] + 4))
    # Each capture had ended on the server: the stop is sent all the same and its 500 read
    # as "already stopped".
    assert [e["status"] for e in answered(logs, "/stop_profile")] == [500, 500, 500]
    assert len(answered(logs, "/start_profile")) == 3


async def test_delay_is_a_start_step_from_the_current_counter(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        # Earlier traffic: an absolute start_step of 3 would be long past.
        await complete(server, max_tokens=10)
        before = server.forward_steps
        win = window(tmp_path / "w", delay=3, forward_steps=4)
        await target.start(win)
        await complete(server, max_tokens=12)
        result = await target.stop(win)
        await target.aclose()
    (trace,) = result.files
    assert forward_step_numbers(trace) == [before + 4, before + 5, before + 6, before + 7]
    assert (result.forward_steps, result.auto_stopped, result.note) == (4, True, None)


async def test_stop_is_sent_while_the_capture_runs(
    reference_server: ReferenceFactory,
    complete: Complete,
    tmp_path: Path,
    timeouts: Any,
    logs: list[Any],
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        before = server.forward_steps
        win = window(tmp_path / "w", forward_steps=50)
        await target.start(win)
        await complete(server, max_tokens=6)
        result = await target.stop(win)
        await target.aclose()
    assert [e["status"] for e in answered(logs, "/stop_profile")] == [200]
    (trace,) = result.files
    assert forward_step_numbers(trace) == list(range(before + 1, before + 7))
    assert (result.forward_steps, result.auto_stopped) == (6, False)


async def test_500_on_stop_means_already_stopped_only_when_auto_stop_was_asked(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    # Without a readable counter the adapter cannot tell that the auto-stop ran, so it
    # sends the stop, which SGLang answers with 500: "nothing running".
    hidden = Faults(fail_routes=frozenset({"/metrics"}))
    async with asyncio.timeout(60), reference_server(dialect="sglang", faults=hidden) as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        win = window(tmp_path / "w", forward_steps=2)
        await target.start(win)
        await complete(server, max_tokens=6)
        result = await target.stop(win)
        await target.aclose()
    assert result.auto_stopped is True
    (trace,) = result.files
    assert len(forward_step_numbers(trace)) == 2

    failing = Faults(fail_routes=frozenset({"/stop_profile"}))
    async with asyncio.timeout(60), reference_server(dialect="sglang", faults=failing) as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        win = window(tmp_path / "unbounded", forward_steps=None)
        await target.start(win)
        result = await target.stop(win)
        await target.aclose()
    assert result.error is not None
    assert result.error.startswith("stop failed: ServerError: POST ")
    assert "/stop_profile answered 500" in result.error


async def test_stop_before_a_delayed_start_is_not_an_auto_stop(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    """A window that ends before its start_step: SGLang answers the stop 500 and the pending
    capture still begins later; the next window first stops it, then starts its own."""
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        await complete(server, max_tokens=2)
        first = window(tmp_path / "w1", step=1, delay=3, forward_steps=None)
        await target.start(first)
        result = await target.stop(first)  # no batch ran: the capture has not begun
        assert (result.auto_stopped, result.forward_steps) == (False, 0)
        await complete(server, max_tokens=8)  # the pending capture begins meanwhile
        second = window(tmp_path / "w2", step=2, delay=1, forward_steps=2)
        await target.start(second)  # without the cleanup stop: 500 "already in progress"
        await complete(server, max_tokens=6)
        result = await target.stop(second)
        await target.aclose()
    (trace,) = result.files
    assert len(forward_step_numbers(trace)) == 2 and result.auto_stopped is True


async def test_delay_without_a_counter_is_noted(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    hidden = Faults(fail_routes=frozenset({"/metrics"}))
    async with asyncio.timeout(60), reference_server(dialect="sglang", faults=hidden) as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        win = window(tmp_path / "w", delay=3)
        await target.start(win)
        await complete(server, max_tokens=8)
        result = await target.stop(win)
        await target.aclose()
    assert result.note is not None
    assert "delay of 3 not applied: the server reports no forward counter" in result.note
    assert result.forward_steps is None


async def test_npu_lists_the_ascend_folders(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0, npu=True)
        await target.open(timeouts)
        win = window(tmp_path / "w", forward_steps=None)
        await target.start(win)
        await complete(server, max_tokens=3)
        # The reference server writes a CPU trace; torch_npu would write this folder instead.
        ascend = win.dir / "host_1234_20250101000000000_ascend_pt"
        (ascend / "FRAMEWORK").mkdir(parents=True)
        result = await target.stop(win)
        await target.aclose()
    assert result.files == (ascend,)
    assert result.note is not None and "torch_npu.profiler.profiler.analyse" in result.note


async def test_no_files_is_noted(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, timeouts: Any
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0, npu=True)
        await target.open(timeouts)
        win = window(tmp_path / "w", forward_steps=None)
        await target.start(win)
        await complete(server, max_tokens=3)
        result = await target.stop(win)
        await target.aclose()
    assert result.files == ()
    assert result.note is not None and "no *_ascend_pt folders" in result.note


async def test_never_stops_a_capture_it_did_not_start(
    reference_server: ReferenceFactory, tmp_path: Path, timeouts: Any, logs: list[Any]
) -> None:
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        with pytest.raises(RuntimeError, match="did not start"):
            await target.stop(window(tmp_path / "w"))
        await target.aclose()
    assert answered(logs, "/stop_profile") == []


async def test_forward_steps_reads_the_reference_counter(
    reference_server: ReferenceFactory, complete: Complete, timeouts: Any
) -> None:
    async with asyncio.timeout(60):
        async with reference_server(dialect="sglang") as server:
            target = SGLangServer(server.url, replica=0)
            await target.open(timeouts)
            await complete(server, max_tokens=5)
            assert await target.forward_steps() == server.forward_steps == 5
            await target.aclose()
        async with reference_server(vllm_version="0.32.0") as other:
            target = SGLangServer(other.url, replica=0)
            await target.open(timeouts)
            assert await target.forward_steps() is None
            await target.aclose()


def test_is_a_managed_capture_target() -> None:
    target = SGLangServer("http://127.0.0.1:1/", replica=2)
    assert isinstance(target, aprof.CaptureTarget) and isinstance(target, aprof.ManagedTarget)
    assert (target.name, target.kind, target.replica) == ("replica_2", "rollout", 2)
    assert target.enforces_window is True
