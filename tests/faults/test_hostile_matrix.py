"""Hostile servers: every misbehaviour on every profiling route of vLLM (by era) and SGLang.

Each case is a small aiohttp app on 127.0.0.1 that speaks the dialect's profiling routes
(``/version``, ``/start_profile``, ``/stop_profile``, ``/metrics``) like the real server and
misbehaves in one way on one route, every time it is called (or, for the answers that may
leave a capture behind, the first time only): an error status, a redirect, a hang, an
endless or oversized answer, a body that is not UTF-8 or not JSON, a connection closed
mid-answer, a counter that overflows, is NaN, goes back or jumps. A real ``aprof.Profiler``
drives ``servers.VLLMServer`` (0.32, 0.30, 0.29) / ``servers.SGLangServer`` (with and
without a delay) through three steps (1 and 3 profiled) with requests in each. The app keeps
a ledger of every call it saw and how it answered; afterwards every step body has run,
nothing escaped, every window is final, and every start that may have begun a capture was
followed by a stop before the next start, except where the adapter's documented rule forbids
the stop (vLLM before 0.30 sends no stop after an interrupted call).

Also here: links swapped in on the way to a vLLM window's folder while it captures, and the
embedded reference server (a real model and torch.profiler) with its own fault knobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

import aprof
from faults.common import (
    check_outside,
    check_windows,
    load,
    on_another_device,
    same_windows,
    snapshot,
)
from faults.tally import Faults
from servers import SGLangServer, VLLMServer
from servers.reference import Faults as ReferenceFaults
from servers.reference import ReferenceConfig, create_app
from servers.trace_files import vllm_prefix

pytestmark = pytest.mark.faults

LIMIT = 65536
TIMEOUTS = {"connect_s": 0.2, "start_s": 0.5, "stop_s": 0.5, "poll_s": 0.01}
CASE_S = 30.0
"""Bound on one case, server and profiler included."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# -- the matrix -------------------------------------------------------------------------------

STATUS = {"s302": 302, "s404": 404, "s409": 409, "s500": 500}
INTERRUPTING = ("hang", "endless", "huge", "cut")
"""Answers the client cannot read to the end: the call may have acted on the server."""
BODY = ("s302", "s404", "s500", *INTERRUPTING, "not_utf8", "garbage", "empty")
ROUTES: dict[str, tuple[str, ...]] = {
    "start": (*BODY, "s409"),
    "stop": (*BODY, "s409"),
    "metrics": (*BODY, "overflow", "nan", "backwards", "jump"),
    "version": (*BODY, "bad_version", "version_type"),
}
SERVERS = {
    # name: (dialect, vLLM version, rollout.delay)
    "vllm-0.32": ("vllm", "0.32.0", 0),  # the server bounds each window; 409 on a 2nd start
    "vllm-0.30": ("vllm", "0.30.0", 0),  # aprof polls; a stop with nothing running is harmless
    "vllm-0.29": ("vllm", "0.29.0", 0),  # aprof polls; no stop is ever sent on a guess
    "sglang": ("sglang", "", 0),
    "sglang-delay": ("sglang", "", 2),  # start_step from the counter; a stop may find it pending
}


def matrix() -> list[Any]:
    """Every behaviour on every route of every server, on every call; and the calls that
    may leave a capture behind, on the first call only (the server recovers)."""
    cases = []
    for server in SERVERS:
        cases.append(pytest.param(server, "none", "none", False, id=f"{server}-none"))
        for route, behaviours in ROUTES.items():
            # SGLang has no /version; a broken /version stops every era alike.
            if route == "version" and server != "vllm-0.32":
                continue
            cases += [
                pytest.param(server, route, b, False, id=f"{server}-{route}-{b}")
                for b in behaviours
            ]
            if route in ("start", "stop"):
                cases += [
                    pytest.param(server, route, b, True, id=f"{server}-{route}-{b}-once")
                    for b in INTERRUPTING
                ]
    return cases


# -- the hostile server -----------------------------------------------------------------------


@dataclass
class Seen:
    """One call the server saw, in the order they arrived."""

    route: str
    status: int | None = None
    """What it answered; ``None`` while (or if ever) unanswered or cut off."""

    @property
    def refused(self) -> bool:
        """Answered whole with a status outside 2xx: the call did nothing."""
        return self.status is not None and not 200 <= self.status < 300


@dataclass
class Hostile:
    """A server of ``dialect`` (vLLM ``version``) that misbehaves as ``behaviour`` on
    ``route``, with a ledger of the calls it saw (``seen``)."""

    dialect: str
    version: str
    route: str
    behaviour: str
    traces: Path
    once: bool = False
    """Misbehave on the route's first call only."""
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the case ends: hanging answers end then."""
    active: dict[str, Any] | None = None
    """The start body of the capture running now, if any."""
    reads: int = 0

    @property
    def era(self) -> tuple[int, ...]:
        """The vLLM version as numbers."""
        return tuple(int(p) for p in self.version.split(".")) if self.version else ()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._ledger])
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/start_profile", self._start)
        app.router.add_post("/stop_profile", self._stop)
        return app

    def fault(self, route: str) -> str:
        """How this call of ``route`` goes."""
        if route != self.route or (self.once and any(s.route == route for s in self.seen[:-1])):
            return "none"
        return self.behaviour

    @web.middleware
    async def _ledger(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        entry = Seen(request.path.strip("/").removesuffix("_profile"))
        self.seen.append(entry)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            entry.status = exc.status
            raise
        entry.status = response.status
        return response

    # -- routes ---------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.StreamResponse:
        fault = self.fault("version")
        body: object = {"version": self.version}
        if fault == "bad_version":
            body = {"version": "banana"}
        elif fault == "version_type":
            body = {"version": 32}
        return await self._answer(request, fault, json.dumps(body).encode())

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        fault = self.fault("metrics")
        self.reads += 1
        name = (
            "vllm:iteration_tokens_total_count"
            if self.dialect == "vllm"
            else "sglang:cuda_graph_passes_total"
        )
        values = [str(self.reads)]
        if fault == "overflow":
            values = ["1.5e308", "1.5e308"]
        elif fault == "nan":
            values = ["NaN", str(self.reads)]
        elif fault == "backwards":
            values = [str(10**6 - 7 * self.reads)]
        elif fault == "jump":
            values = [str(self.reads * 10**15)]
        page = "".join(f'{name}{{engine="{i}"}} {v}\n' for i, v in enumerate(values))
        return await self._answer(request, fault, ("# HELP x\n" + page).encode())

    async def _start(self, request: web.Request) -> web.StreamResponse:
        fault = self.fault("start")
        if fault in STATUS:
            return web.Response(status=STATUS[fault], text="refused")
        if self.dialect == "vllm" and self.era >= (0, 32) and self.active is not None:
            return web.json_response({"error": {"message": "already active"}}, status=409)
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        self.active = body if isinstance(body, dict) else {}
        text = b"Start profiling.\n" if self.dialect == "sglang" else b""
        return await self._answer(request, fault, text)

    async def _stop(self, request: web.Request) -> web.StreamResponse:
        fault = self.fault("stop")
        if fault in STATUS:
            return web.Response(status=STATUS[fault], text="refused")
        if self.active is None:
            if self.dialect == "sglang" or self.era < (0, 30):
                return web.Response(status=500, text="Internal Server Error")
            return web.Response(status=200)
        self._write_trace(self.active)
        self.active = None
        text = b"Stop profiling. This will take some time.\n" if self.dialect == "sglang" else b""
        return await self._answer(request, fault, text)

    def _write_trace(self, body: dict[str, Any]) -> None:
        """The capture's trace, where the real server writes it."""
        ns = time.time_ns()
        if self.dialect == "sglang":
            folder, name = body.get("output_dir"), f"{body.get('profile_id')}-TP-0.trace.json.gz"
            if not isinstance(folder, str):
                return
            path = Path(folder) / name
        else:
            prefix = body.get("profile_prefix")
            path = self.traces / f"{f'{prefix}_' if prefix else ''}rank0.{ns}.pt.trace.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(b'{"traceEvents": []}'))

    # -- answers --------------------------------------------------------------------------

    async def _answer(self, request: web.Request, fault: str, body: bytes) -> web.StreamResponse:
        if fault in STATUS:
            where = {"Location": "/elsewhere"} if fault == "s302" else None
            return web.Response(status=STATUS[fault], text="refused", headers=where)
        if fault == "hang":
            await self.release.wait()
            return web.Response(body=body)
        if fault == "not_utf8":
            body = b"\xff\xfe\x80 not UTF-8 \xc3\x28\n" + body
        elif fault == "garbage":
            body = b'{"version": [0.32, \x00 {{{ "unterminated'
        elif fault == "empty":
            body = b""
        elif fault == "endless":
            return await self._endless(request)
        elif fault == "huge":
            response = web.StreamResponse()
            response.content_length = 10**12
            await response.prepare(request)
            await response.write(body[:16] or b"{")
            await self.release.wait()  # the rest never comes
            return response
        elif fault == "cut":
            response = web.StreamResponse()
            response.content_length = len(body) + 1000
            await response.prepare(request)
            await response.write(body[: len(body) // 2] or b"{")
            assert request.transport is not None
            request.transport.abort()  # the connection drops mid-answer
            return response
        return web.Response(body=body, content_type="text/plain")

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65536
        with contextlib.suppress(ConnectionError):
            for _ in range(4096):  # 256 MiB: far past any socket buffer, endless to a client
                if self.release.is_set():
                    break
                await response.write(chunk)
        return response


@contextlib.asynccontextmanager
async def serve(app: web.Application, release: asyncio.Event) -> AsyncIterator[str]:
    """``app`` on a free port of 127.0.0.1 until the block ends; yields its URL."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        release.set()
        await runner.cleanup()


# -- the ledger's rules -----------------------------------------------------------------------


def unstopped_starts(seen: list[Seen], *, exempt: Callable[[Seen], bool]) -> list[int]:
    """Indices of starts that may have begun a capture (not refused) and were not followed by
    a stop before the next such start, or before the end."""
    missing = []
    for i, entry in enumerate(seen):
        if entry.route != "start" or entry.refused or exempt(entry):
            continue
        stopped = False
        for later in seen[i + 1 :]:
            if later.route == "stop":
                stopped = True
                break
            if later.route == "start" and not later.refused:
                break
        if not stopped:
            missing.append(i)
    return missing


def stops_on_nothing(seen: list[Seen]) -> list[int]:
    """Indices of stops sent when no start could have begun a capture since the last stop."""
    stray, capturing = [], False
    for i, entry in enumerate(seen):
        if entry.route == "start" and not entry.refused:
            capturing = True
        elif entry.route == "stop":
            if not capturing:
                stray.append(i)
            capturing = False
    return stray


# -- driving ----------------------------------------------------------------------------------


def profiler(save: Path, **sections: Any) -> aprof.Profiler:
    return aprof.Profiler(
        {
            # Each step waits for its stops: step 3's window is not skipped behind step 1's.
            "global_profiler": {"steps": [1, 3], "save_path": str(save), "wait_for_stops": True},
            "rollout": {"forward_steps": 4},
            "timeouts": TIMEOUTS,
            "limits": {"answer_bytes": LIMIT},
            "log": {"level": "error"},
            **sections,
        }
    )


Work = Callable[[int, aprof.Request], Awaitable[None]]
"""What a request does inside ``prof.request``, told its step and itself."""


async def drive(prof: aprof.Profiler, faults: Faults, work: Work) -> list[int]:
    """Three steps with six concurrent requests to replica 0 each; returns the steps whose
    body ran to its end. Anything that escapes the profiler is lost."""
    ran: list[int] = []

    async def one(n: int) -> None:
        async with prof.request(replica=0) as req:
            await work(n, req)

    try:
        async with prof:
            for n in (1, 2, 3):
                try:
                    async with prof.step(n):
                        await asyncio.gather(*(one(n) for _ in range(6)))
                        ran.append(n)
                except Exception as exc:
                    faults.check("escaped", False, f"step {n}: {type(exc).__name__}: {exc}")
    except Exception as exc:
        faults.check("escaped", False, f"profiler: {type(exc).__name__}: {exc}")
    faults.check("escaped", ran == [1, 2, 3], f"step bodies that ran: {ran}")
    return ran


async def until_enforced(prof: aprof.Profiler, step: int, req: aprof.Request) -> None:
    """A request that lasts while aprof polls the counter of its captured window: until the
    poller has stopped the window, or given up on the counter (at most 1 s)."""
    record = prof.manifest.window(step, "replica_0")
    if not req.captured or record is None or record.forward_steps.enforced_by != "aprof":
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            # No event says so: a bounded poll of the live record.
            counts = record.forward_steps
            while record.stop_reason is None and counts.enforced_by == "aprof":  # noqa: ASYNC110
                await asyncio.sleep(TIMEOUTS["poll_s"])


def check_run(faults: Faults, prof: aprof.Profiler, before: dict[str, Any], tmp: Path) -> None:
    manifest = load(faults, prof.save_path)
    check_windows(faults, manifest)
    assert same_windows(prof.manifest, manifest)
    assert {w.step for w in prof.manifest.windows} <= {1, 3}
    check_outside(faults, before, snapshot(tmp, exclude=[prof.save_path, tmp / "traces"]))


@pytest.mark.parametrize(("server", "route", "behaviour", "once"), matrix())
async def test_hostile_server(
    tmp_path: Path, faults: Faults, server: str, route: str, behaviour: str, once: bool
) -> None:
    """One misbehaviour on one route: the run goes on, windows end final with the reason, and
    every start that may have begun a capture gets its stop (but where vLLM < 0.30 forbids);
    a server that misbehaved once is captured again at the next window."""
    dialect, version, delay = SERVERS[server]
    traces = tmp_path / "traces"
    traces.mkdir()
    fake = Hostile(dialect, version, route, behaviour, traces, once=once)
    save = tmp_path / "profile"
    before = snapshot(tmp_path, exclude=[save, traces])
    prof = profiler(save, rollout={"forward_steps": 4, "delay": delay})
    async with asyncio.timeout(CASE_S), serve(fake.app(), fake.release) as url:
        if dialect == "vllm":
            prof.add_target(VLLMServer(url, replica=0, profiler_dir=traces))
        else:
            prof.add_target(SGLangServer(url, replica=0))
        await drive(prof, faults, partial(until_enforced, prof))
        seen = list(fake.seen)  # as the profiler closed
    faults.count("behaviours")

    # vLLM before 0.30 never sends a stop on a guess: after an interrupted start, none.
    def exempt(entry: Seen) -> bool:
        return version.startswith("0.29") and route == "start" and behaviour in INTERRUPTING

    missing = unstopped_starts(seen, exempt=exempt)
    calls = [(e.route, e.status) for e in seen if e.route in ("start", "stop")]
    faults.check("not_stopped", not missing, f"starts at {missing} never stopped: {calls}")
    if version.startswith("0.29"):
        assert not stops_on_nothing(seen), f"a stop with nothing running: {calls}"
    check_run(faults, prof, before, tmp_path)
    if once or behaviour == "none":
        last = prof.manifest.window(3, "replica_0")
        assert last is not None and last.state == "done", last
    faults.assert_nothing_lost()


# -- links swapped in while a capture runs --------------------------------------------------------

SWAPS = {
    # what is swapped, while the window of step 1 is active: (link at, moved there first)
    "window-folder": ("step_1/rollout/replica_0", False),
    "window-folder-dangling": ("step_1/rollout/replica_0", None),
    "trace-entry": ("", False),
    "step-folder-moved-out": ("step_1", True),
    "rollout-folder-moved-out": ("step_1/rollout", True),
}


def swaps() -> list[Any]:
    cases = []
    for swap in SWAPS:
        for server in ("vllm-0.32", "vllm-0.30"):
            for device in ("same-device", "other-device"):
                name = f"{swap}-{server}-{device}"
                cases.append(pytest.param(swap, server, device, id=name))
    return cases


@pytest.mark.parametrize(("swap", "server", "device"), swaps())
async def test_link_swapped_in_while_capturing(
    tmp_path: Path,
    faults: Faults,
    monkeypatch: pytest.MonkeyPatch,
    swap: str,
    server: str,
    device: str,
) -> None:
    """While a vLLM window is active, a folder on the way to it is swapped for a link to the
    outside (or the window's trace in vLLM's folder is a link): the traces are moved (or
    copied, across devices) into save_path or left where vLLM wrote them, never outside."""
    dialect, version, _ = SERVERS[server]
    traces, outside = tmp_path / "traces", tmp_path / "outside"
    traces.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"not aprof's\n")
    if device == "other-device":
        on_another_device(monkeypatch, traces)
    fake = Hostile(dialect, version, "none", "none", traces)
    save = tmp_path / "profile"
    prof = profiler(save)
    where, moved = SWAPS[swap]
    before: dict[str, Any] = {}

    async def plant(step: int, req: aprof.Request) -> None:
        if step != 1 or not req.captured or before:
            return
        if swap == "trace-entry":
            prefix = vllm_prefix(f"replica_0-step1-{prof.manifest.run_id}")
            stem = f"{prefix}_" if fake.era >= (0, 32) else ""
            (traces / f"{stem}rank0.1.pt.trace.json.gz").symlink_to(outside / "secret")
        else:
            link = save / where
            if moved:
                shutil.move(link, outside / "moved")
                link.symlink_to(outside / "moved", target_is_directory=True)
            else:
                link.rmdir()
                to = outside / "missing" if moved is None else outside
                link.symlink_to(to, target_is_directory=True)
        faults.count("links")
        before.update(snapshot(tmp_path, exclude=[save, traces]))

    async with asyncio.timeout(CASE_S), serve(fake.app(), fake.release) as url:
        prof.add_target(VLLMServer(url, replica=0, profiler_dir=traces))
        await drive(prof, faults, plant)
    assert before, "the window of step 1 never became active"
    check_run(faults, prof, before, tmp_path)
    inside = [p for p in save.rglob("*") if p.is_symlink() and p != save / where]
    assert not inside, f"links aprof put inside save_path: {inside}"
    faults.assert_nothing_lost()


# -- the reference server, with its own fault knobs ---------------------------------------------

REFERENCE_FAULTS = {
    "none": ReferenceFaults(),
    "fail_start": ReferenceFaults(fail_routes=frozenset({"/start_profile"})),
    "fail_stop": ReferenceFaults(fail_routes=frozenset({"/stop_profile"})),
    "fail_metrics": ReferenceFaults(fail_routes=frozenset({"/metrics"})),
}


@pytest.mark.parametrize("fault", list(REFERENCE_FAULTS))
@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_reference_server(tmp_path: Path, faults: Faults, dialect: str, fault: str) -> None:
    """The embedded reference server (a real model and torch.profiler) with a failing route,
    serving real completions inside ``prof.request``: the same promises hold."""
    pytest.importorskip("torch")
    traces = tmp_path / "traces"
    save = tmp_path / "profile"
    cfg = ReferenceConfig(dialect=dialect, profiler_dir=traces, faults=REFERENCE_FAULTS[fault])
    app = create_app(cfg)
    seen: list[Seen] = []

    @web.middleware
    async def ledger(request: web.Request, handler: Handler) -> web.StreamResponse:
        entry = Seen(request.path.strip("/").removesuffix("_profile"))
        seen.append(entry)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            entry.status = exc.status
            raise
        entry.status = response.status
        return response

    app.middlewares.insert(0, ledger)
    before = snapshot(tmp_path, exclude=[save, traces])
    prof = profiler(save, timeouts={**TIMEOUTS, "start_s": 10, "stop_s": 10, "connect_s": 5})
    release = asyncio.Event()
    async with asyncio.timeout(120), serve(app, release) as url:
        if dialect == "vllm":
            prof.add_target(VLLMServer(url, replica=0, profiler_dir=traces))
        else:
            prof.add_target(SGLangServer(url, replica=0))
        body = {"model": cfg.model_name, "prompt": "hi", "max_tokens": 3}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def complete(n: int, req: aprof.Request) -> None:
                async with http.post(f"{url}/v1/completions", json=body) as answer:
                    assert answer.status == 200, await answer.text()

            await drive(prof, faults, complete)
        calls = [(e.route, e.status) for e in seen if e.route in ("start", "stop")]
    faults.count("behaviours")
    missing = unstopped_starts(seen, exempt=lambda _: False)
    faults.check("not_stopped", not missing, f"starts at {missing} never stopped: {calls}")
    check_run(faults, prof, before, tmp_path)
    if fault == "none":
        assert [w.state for w in prof.manifest.windows] == ["done", "done"]
    faults.assert_nothing_lost()
