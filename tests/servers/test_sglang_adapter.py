"""``servers.SGLangServer`` over real HTTP against the reference server's SGLang dialect.

The reference server follows SGLang's HTTP protocol (reference note sglang.md, sections 2-6,
and section 12: what a real 0.5.23 server was observed to answer); a small recording
imitation shows the bodies the adapter sends. Window semantics are driven through
``aprof.Profiler``; protocol details call the adapter directly. Nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from adapter_steps import STEPS, TIMEOUTS, answered, config, run_steps, window
from aiohttp import web
from conftest import Complete, ReferenceFactory

import aprof
from aprof.testing import assert_windows
from servers import SGLangServer
from servers.reference import Faults, forward_step_numbers
from servers.trace_files import count_sglang_steps


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
    # No counter, but the trace holds the window's forward passes.
    assert (result.forward_steps, result.counted_from) == (4, "trace")


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


async def test_observed_is_counted_from_the_step_annotations(
    reference_server: ReferenceFactory,
    complete: Complete,
    tmp_path: Path,
    timeouts: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with asyncio.timeout(60), reference_server(dialect="sglang") as server:
        target = SGLangServer(server.url, replica=0)
        await target.open(timeouts)
        win = window(tmp_path / "w", forward_steps=3)
        await target.start(win)
        await complete(server, max_tokens=6)
        result = await target.stop(win)
        # A trace that cannot be read: the counter (summed over modes) stands in.
        monkeypatch.setattr("servers.sglang.sglang_steps_in", lambda files: None)
        again = window(tmp_path / "w2", step=2, forward_steps=50)
        await target.start(again)
        await complete(server, max_tokens=5)
        fallback = await target.stop(again)
        await target.aclose()
    (trace,) = result.files
    assert count_sglang_steps(trace) == len(forward_step_numbers(trace)) == 3
    assert (result.forward_steps, result.counted_from, result.auto_stopped) == (3, "trace", True)
    assert (fallback.forward_steps, fallback.counted_from) == (5, "counter")


async def test_version_is_read_from_server_info(
    reference_server: ReferenceFactory, timeouts: Any, logs: list[Any]
) -> None:
    async with asyncio.timeout(30):
        async with reference_server(dialect="sglang") as server:
            target = SGLangServer(server.url, replica=0)
            await target.open(timeouts)
            assert target.version == (0, 5, 23)
            await target.aclose()
        given = SGLangServer(server.url, replica=0, version="0.5.10")
        assert given.version == (0, 5, 10)
        # A server with no /server_info (here the vLLM dialect): the version stays unknown
        # and the target still opens; /version is never asked (404 on real SGLang).
        async with reference_server(vllm_version="0.32.0") as other:
            target = SGLangServer(other.url, replica=0)
            await target.open(timeouts)
            assert target.version is None
            await target.aclose()
    assert [e["status"] for e in answered(logs, "/server_info")] == [200, 404]
    assert [e["status"] for e in answered(logs, "/get_server_info")] == [404]
    assert answered(logs, "/version") == []
    assert any(e["event"] == "sglang version unknown" for e in logs)


class Recorder:
    """An SGLang 0.5.23 imitation that records each call (path and JSON body): a start
    answers 200 (a second one would silently restart the capture); after ``auto_stop()``,
    or with nothing running, a stop answers 500 text/plain."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.running = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/server_info", self._info)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/start_profile", self._start)
        app.router.add_post("/stop_profile", self._stop)
        return app

    def auto_stop(self) -> None:
        self.running = False

    def starts(self) -> list[dict[str, Any]]:
        return [body for path, body in self.calls if path == "/start_profile"]

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.5.23"})

    async def _metrics(self, request: web.Request) -> web.Response:
        page = (
            'sglang:cuda_graph_passes_total{mode="prefill_none"} 7.0\n'
            'sglang:cuda_graph_passes_total{mode="decode_none"} 21.0\n'
        )
        return web.Response(text=page)

    async def _start(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, await request.json()))
        self.running = True
        return web.Response(text="Start profiling.\n")

    async def _stop(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, None))
        if not self.running:
            return web.Response(status=500, text="Internal Server Error")
        self.running = False
        return web.Response(text="Stop profiling. This will take some time.\n")


@contextlib.asynccontextmanager
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    fake = Recorder()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield fake, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_start_body_sets_stack_and_shapes_and_the_counter_sums_modes(
    tmp_path: Path, timeouts: Any
) -> None:
    async with asyncio.timeout(30), recorder() as (fake, url):
        target = SGLangServer(url, replica=0)
        await target.open(timeouts)
        assert await target.forward_steps() == 28  # 7 prefill + 21 decode passes
        win = window(tmp_path / "w", delay=2, forward_steps=5)
        await target.start(win)
        await target.stop(win)
        asked = SGLangServer(url, replica=0, with_stack=True, record_shapes=True)
        await asked.open(timeouts)
        win2 = window(tmp_path / "w2", step=2, forward_steps=None)
        await asked.start(win2)
        await asked.stop(win2)
        await target.aclose()
        await asked.aclose()
    first, second = fake.starts()
    assert first == {
        "output_dir": str(win.dir),
        "profile_id": win.prefix,
        "activities": ["CPU", "GPU"],
        "with_stack": False,
        "record_shapes": False,
        "num_steps": 5,
        "start_step": 28 + 2 + 1,  # the counter read just before, plus the delay, plus one
    }
    assert (second["with_stack"], second["record_shapes"]) == (True, True)
    assert "num_steps" not in second and "start_step" not in second


async def test_a_second_start_is_never_sent_while_a_capture_may_run(
    tmp_path: Path, timeouts: Any
) -> None:
    async with asyncio.timeout(30), recorder() as (fake, url):
        target = SGLangServer(url, replica=0)
        await target.open(timeouts)
        first = window(tmp_path / "w1", step=1, forward_steps=4)
        await target.start(first)
        # SGLang would answer a second start 200 and silently restart the capture.
        with pytest.raises(RuntimeError, match="still active"):
            await target.start(window(tmp_path / "w2", step=2))
        assert [path for path, _ in fake.calls] == ["/start_profile"]
        # The server ends the capture on its own; nothing says so until the stop, which
        # answers 500 and is read as "already stopped" for this num_steps window.
        fake.auto_stop()
        result = await target.stop(first)
        assert result.auto_stopped is True and result.error is None
        second = window(tmp_path / "w3", step=3, forward_steps=None)
        await target.start(second)
        await target.stop(second)
        await target.aclose()
    assert [path for path, _ in fake.calls] == [
        "/start_profile",
        "/stop_profile",
        "/start_profile",
        "/stop_profile",
    ]
