"""Both HTTP adapters against hostile or dying servers: small scripted aiohttp apps (and one
raw asyncio server) on 127.0.0.1.

Whatever the server does, a capture that may have started gets a stop, no answer is read
past ``limits.answer_bytes``, no redirect is followed, no credential reaches the manifest or
the logs, and the manifest says what happened. Nothing sleeps; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import itertools
import json
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from adapter_steps import window
from aiohttp import web

import aprof
from aprof.testing import assert_windows
from servers import AnswerTooLargeError, ServerError, SGLangServer, VLLMServer
from servers._http import metric_total

TIMEOUTS = {"start_s": 30, "stop_s": 30, "poll_s": 0.005, "connect_s": 5}
METRIC = {"vllm": "vllm:iteration_tokens_total_count", "sglang": "sglang:cuda_graph_passes_total"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def config(save: Path, *, steps: int = 1, **sections: Any) -> aprof.ProfilerConfig:
    """Profile steps 1..``steps``, 4 forward steps each, each step waiting for its stop."""
    return aprof.load_config(
        {
            "global_profiler": {
                "steps": list(range(1, steps + 1)),
                "save_path": str(save),
                "wait_for_stops": True,
            },
            "rollout": {"forward_steps": 4},
            "timeouts": {**TIMEOUTS, **sections.pop("timeouts", {})},
            **sections,
        }
    )


@dataclass
class Fake:
    """A scripted server of either dialect: what its routes answer, and what it was asked."""

    dialect: str = "vllm"
    metrics: list[bytes] = field(default_factory=lambda: [b""])
    """``/metrics`` pages served in turn, the last one from then on."""
    start: Handler | None = None
    """Replaces the ``/start_profile`` handler (default: 200)."""
    stop: Handler | None = None
    """Replaces the ``/stop_profile`` handler (default: 200)."""
    traces: Path | None = None
    """Where the start writes the capture's trace at once (vLLM: its profiler folder)."""
    calls: list[str] = field(default_factory=list)
    """``"METHOD /path"`` of every request, in order."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the test ends: handlers that hang wait for it."""
    hanging: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a request hangs."""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_post("/start_profile", self.start or self._start)
        app.router.add_post("/stop_profile", self.stop or self._ok)
        return app

    def count(self, call: str) -> int:
        return self.calls.count(call)

    async def hang(self, request: web.Request) -> web.StreamResponse:
        self.hanging.set()
        await self.release.wait()
        return web.Response(status=200)

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.calls.append(f"{request.method} {request.path}")
        return await handler(request)

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"version": "0.32.0"})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        page = self.metrics.pop(0) if len(self.metrics) > 1 else self.metrics[0]
        return web.Response(body=page, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def _start(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.dialect == "sglang":
            _trace(Path(body["output_dir"]) / f"{body['profile_id']}-TP-0.trace.json.gz")
        elif self.traces is not None:
            _trace(
                self.traces / f"{body['profile_prefix']}_rank0.{time.time_ns()}.pt.trace.json.gz"
            )
        return web.json_response({})

    async def _ok(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)


def _trace(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))


class Running:
    """A fake being served; ``kill()`` takes it away as a crash would."""

    def __init__(self, fake: Fake, runner: web.AppRunner) -> None:
        self.fake = fake
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        self.url = f"http://127.0.0.1:{self.port}"

    async def kill(self) -> None:
        self.fake.release.set()
        await self._runner.cleanup()


@contextlib.asynccontextmanager
async def serve(fake: Fake) -> AsyncIterator[Running]:
    """``fake`` on a free port of 127.0.0.1 until the block ends (or it is killed)."""
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield Running(fake, runner)
    finally:
        fake.release.set()
        await runner.cleanup()


def adapter(dialect: str, url: str, **kwargs: Any) -> VLLMServer | SGLangServer:
    if dialect == "vllm":
        return VLLMServer(url, replica=0, version="0.32.0", **kwargs)
    return SGLangServer(url, replica=0, **kwargs)


async def one_step(prof: aprof.Profiler, n: int = 1) -> None:
    """Step ``n`` with one request on replica 0 (it opens the window and waits for its start)."""
    async with prof.step(n), prof.request(replica=0):
        pass


def page(dialect: str, *values: str) -> bytes:
    """Prometheus text with one sample of the dialect's counter per value."""
    name = METRIC[dialect]
    return "".join(f'{name}{{engine="{i}"}} {v}\n' for i, v in enumerate(values)).encode()


# -- 1. a start that may have succeeded always gets its stop ---------------------------------


NOT_UTF8 = {
    "vllm": b"# \xff\xfe not UTF-8\nvllm:iteration_tokens_total_count 5\n",
    "sglang": b"# \xff\xfe not UTF-8\nsglang:cuda_graph_passes_total 5\n",
}


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize("bad", ["not_utf8", "overflow"])
@pytest.mark.parametrize("when", ["after_start", "before_stop"])
async def test_unreadable_metrics_never_fail_the_start_nor_skip_the_stop(
    tmp_path: Path, dialect: str, bad: str, when: str
) -> None:
    page_bad = NOT_UTF8[dialect] if bad == "not_utf8" else page(dialect, "1e308", "1e308")
    pages = [page_bad] if when == "after_start" else [page(dialect, "5"), page_bad]
    fake = Fake(dialect=dialect, metrics=pages)
    prof = aprof.Profiler(config(tmp_path / "profile"))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(adapter(dialect, server.url))
        async with prof:
            await one_step(prof)
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "error": None}])
    assert fake.count("POST /stop_profile") == 1


async def test_sglang_sends_the_stop_whatever_the_counter_says(tmp_path: Path) -> None:
    """A counter that jumps past the window's end is no proof of the auto-stop."""
    fake = Fake(dialect="sglang", metrics=[page("sglang", "0"), page("sglang", "1000")])
    prof = aprof.Profiler(config(tmp_path / "profile"))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(SGLangServer(server.url, replica=0))
        async with prof:
            await one_step(prof)
    assert fake.count("POST /stop_profile") == 1
    # It answered 200: the server was still capturing.
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "step_end"}])


@pytest.mark.parametrize(("dialect", "version"), [("vllm", "0.32.0"), ("sglang", None)])
async def test_a_start_cut_off_on_the_way_is_stopped_when_the_target_closes(
    tmp_path: Path, dialect: str, version: str | None
) -> None:
    fake = Fake(dialect=dialect)
    fake.start = fake.hang
    async with asyncio.timeout(60), serve(fake) as server:
        target = adapter(dialect, server.url)
        await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        win = window(tmp_path / "w")
        starting = asyncio.create_task(target.start(win))
        await fake.hanging.wait()  # the server has the start
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await target.aclose()
    assert fake.count("POST /stop_profile") == 1


async def test_vllm_before_030_sends_no_stop_when_the_target_closes(tmp_path: Path) -> None:
    """A stop with nothing running may crash vLLM before 0.30: never sent on a guess."""
    fake = Fake()
    fake.start = fake.hang
    async with asyncio.timeout(60), serve(fake) as server:
        target = VLLMServer(server.url, replica=0, version="0.29.0")
        await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        starting = asyncio.create_task(target.start(window(tmp_path / "w")))
        await fake.hanging.wait()
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await target.aclose()
    assert fake.count("POST /stop_profile") == 0


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_the_last_window_whose_stop_timed_out_is_stopped_at_the_end(
    tmp_path: Path, dialect: str
) -> None:
    fake = Fake(dialect=dialect)

    async def first_hangs(request: web.Request) -> web.StreamResponse:
        if fake.count("POST /stop_profile") == 1:
            return await fake.hang(request)
        return web.Response(status=200)

    fake.stop = first_hangs
    prof = aprof.Profiler(config(tmp_path / "profile", timeouts={"stop_s": 0.5}))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(adapter(dialect, server.url))
        async with prof:
            await one_step(prof)
        assert fake.count("POST /stop_profile") == 2
    assert_windows(prof.manifest, [{"step": 1, "state": "timeout"}])


# -- 2. answers are bounded ------------------------------------------------------------------

LIMIT = 65536


async def test_an_endless_answer_is_cut_off_at_the_limit(tmp_path: Path) -> None:
    fake = Fake()
    ended = asyncio.Event()
    sent, hung_up = 0, False
    most = 128 * 1024**2  # far past any socket buffer: endless, as far as the client can tell

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent, hung_up
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            while sent < most:
                await response.write(b"x" * 65536)
                sent += 65536
        except ConnectionError:
            hung_up = True
        finally:
            ended.set()
        return response

    fake.stop = endless
    prof = aprof.Profiler(config(tmp_path / "profile", limits={"answer_bytes": LIMIT}))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(VLLMServer(server.url, replica=0, version="0.32.0"))
        async with prof:
            await one_step(prof)
        await ended.wait()
    assert hung_up and sent < most  # the client stopped reading and closed the connection
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    assert prof.manifest.windows[0].error == (
        f"stop failed: AnswerTooLargeError: POST {server.url}/stop_profile answered more "
        f"than {LIMIT} bytes (limits.answer_bytes)"
    )


async def test_a_longer_content_length_is_refused_unread(tmp_path: Path) -> None:
    """A 2xx start whose answer is refused may still have started: it is stopped."""
    fake = Fake()
    peers: dict[str, Any] = {}

    async def huge(request: web.Request) -> web.StreamResponse:
        peers["start"] = _peer(request)
        response = web.StreamResponse()
        response.content_length = 10**12
        await response.prepare(request)
        await response.write(b"{}")
        await fake.release.wait()  # the rest never comes: reading it would hang
        return response

    async def stop(request: web.Request) -> web.StreamResponse:
        peers["stop"] = _peer(request)
        return web.Response(status=200)

    fake.start, fake.stop = huge, stop
    prof = aprof.Profiler(config(tmp_path / "profile", limits={"answer_bytes": LIMIT}))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(VLLMServer(server.url, replica=0, version="0.32.0"))
        async with prof:
            await one_step(prof)
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    error = prof.manifest.windows[0].error
    assert error is not None and f"answered more than {LIMIT} bytes" in error
    # The target's close stopped what the start may have begun, on a connection of its own.
    assert fake.count("POST /stop_profile") == 1
    assert peers["stop"] != peers["start"]


def test_errors_pickle() -> None:
    for error in (
        ServerError("POST", "http://h/p", 302, "", "http://h/q"),
        AnswerTooLargeError("POST", "http://h/p", 200, LIMIT),
    ):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)


def test_metric_totals_never_raise() -> None:
    name = METRIC["vllm"]
    assert metric_total(page("vllm", "1e308", "1e308").decode(), name) is None
    assert metric_total(page("vllm", "inf", "nan").decode(), name) is None
    assert metric_total(page("vllm", "2", "3.0").decode(), name) == 5
    assert metric_total("\ufffd garbage", name) is None


# -- 3. no redirects --------------------------------------------------------------------------


async def test_a_redirected_start_fails_the_window(tmp_path: Path) -> None:
    fake = Fake()

    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/health")

    fake.start = moved
    prof = aprof.Profiler(config(tmp_path / "profile"))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(VLLMServer(server.url, replica=0, version="0.32.0"))
        async with prof:
            await one_step(prof)
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    error = prof.manifest.windows[0].error
    assert error is not None
    assert "/start_profile answered 302 (a redirect to /health, not followed)" in error
    assert fake.calls == ["POST /start_profile"]


# -- 4. credentials ---------------------------------------------------------------------------

PASSWORD = "pw-7f3a9c1e"


async def test_credentials_in_the_url_are_used_and_shown_nowhere(
    tmp_path: Path, logs: list[Any]
) -> None:
    fake = Fake()
    expected = "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()

    async def guarded(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != expected:
            return web.Response(status=401)
        return web.json_response({})

    async def failing(request: web.Request) -> web.StreamResponse:
        return web.Response(status=500, text="stop went wrong")

    fake.start, fake.stop = guarded, failing
    save = tmp_path / "profile"
    prof = aprof.Profiler(config(save))
    async with asyncio.timeout(60), serve(fake) as server:
        target = VLLMServer(
            f"http://admin:{PASSWORD}@127.0.0.1:{server.port}", replica=0, version="0.32.0"
        )
        prof.add_target(target)
        async with prof:
            await one_step(prof)
    # The start got through with the credentials; the failed stop put its URL in the manifest.
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    error = prof.manifest.windows[0].error
    assert error is not None and f"POST {server.url}/stop_profile answered 500" in error
    assert target._client.base_url == server.url
    assert PASSWORD not in repr(logs)
    assert logs and any(e.get("server") == server.url for e in logs)
    for path in save.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            text = gzip.decompress(data) if path.suffix == ".gz" else data
            assert PASSWORD.encode() not in text, path


def test_credentials_in_the_url_and_a_key_are_refused() -> None:
    with pytest.raises(ValueError, match="either in its URL or as api_key") as raised:
        SGLangServer(f"http://admin:{PASSWORD}@127.0.0.1:1", replica=0, api_key="key")
    assert PASSWORD not in str(raised.value)


# -- 5. no connection is used again after an error answer -------------------------------------


@contextlib.asynccontextmanager
async def sglang_that_drops_connections_after_errors() -> AsyncIterator[
    tuple[str, list[tuple[int, str]]]
]:
    """A raw HTTP server speaking SGLang's profile routes, which, like SGLang after the 500
    on a stop with nothing running, serves nothing more on that connection: the next request
    on it is reset. Yields its URL and the (connection, request) pairs it served."""
    served: list[tuple[int, str]] = []
    numbers = itertools.count()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number, dropped = next(numbers), False
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                if dropped:
                    writer.transport.abort()
                    return
                method, path, _ = head.split(" ", 2)
                length = next(
                    (
                        int(line.split(":", 1)[1])
                        for line in head.split("\r\n")
                        if line.lower().startswith("content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                served.append((number, f"{method} {path}"))
                status, body = (
                    (500, b"not in progress") if path == "/stop_profile" else (200, b"{}")
                )
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
                await writer.drain()
                dropped = status >= 400
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", served
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_that_answered_an_error_is_not_used_again(tmp_path: Path) -> None:
    prof = aprof.Profiler(config(tmp_path / "profile", steps=2))
    async with asyncio.timeout(60), sglang_that_drops_connections_after_errors() as (url, served):
        prof.add_target(SGLangServer(url, replica=0))
        async with prof:
            await one_step(prof, 1)
            await one_step(prof, 2)
    done = {"state": "done", "stop_reason": "auto_stop", "error": None}
    assert_windows(prof.manifest, [{"step": n, **done} for n in (1, 2)])
    stops = [n for n, call in served if call == "POST /stop_profile"]
    starts = [n for n, call in served if call == "POST /start_profile"]
    assert len(stops) == 2 and starts[1] != stops[0]


# -- 6. a server restarted during the window ----------------------------------------------------


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_a_counter_that_went_back_fails_the_window(tmp_path: Path, dialect: str) -> None:
    fake = Fake(dialect=dialect, metrics=[page(dialect, "100"), page(dialect, "3")])
    prof = aprof.Profiler(config(tmp_path / "profile"))
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(adapter(dialect, server.url))
        async with prof:
            await one_step(prof)
    assert_windows(
        prof.manifest,
        [
            {
                "step": 1,
                "state": "failed",
                "forward_steps.observed": None,
                "error": "the server restarted during the window (forward-step counter 100 at "
                "start, 3 at stop): its capture was lost",
            }
        ],
    )
    assert fake.count("POST /stop_profile") == 1


# -- 7. a server killed during the window -------------------------------------------------------


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_a_killed_server_leaves_a_failed_window_that_lists_its_traces(
    tmp_path: Path, dialect: str
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    fake = Fake(dialect=dialect, traces=traces)
    save = tmp_path / "profile"
    prof = aprof.Profiler(config(save))
    kwargs = {"profiler_dir": traces} if dialect == "vllm" else {}
    async with asyncio.timeout(60), serve(fake) as server:
        prof.add_target(adapter(dialect, server.url, **kwargs))
        async with prof, prof.step(1), prof.request(replica=0):
            await server.kill()  # after the start wrote its trace
    assert_windows(prof.manifest, [{"step": 1, "state": "failed", "stop_reason": "error"}])
    record = prof.manifest.windows[0]
    assert record.error is not None
    assert record.error.startswith("stop failed: ClientConnectorError: ")
    (entry,) = record.files
    assert entry.path.startswith("step_1/rollout/replica_0/replica_0-step1-")
    assert (save / entry.path).is_file()
    assert list(traces.iterdir()) == []


def _peer(request: web.Request) -> Any:
    assert request.transport is not None
    return request.transport.get_extra_info("peername")
