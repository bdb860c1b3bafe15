"""Reference servers as rollout replicas for the agentloop tests: served on 127.0.0.1, counted,
held, and stopped the way a crashed replica goes away."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from agentloop import Sample
from servers.reference import ReferenceConfig, create_app
from servers.reference.engine import Engine, StepInfo
from servers.reference.state import STATE

ReplicaFactory = Callable[..., contextlib.AbstractAsyncContextManager[list["Replica"]]]
"""The ``replicas`` fixture: ``async with replicas(2, dialect="sglang") as [a, b]:``."""
COMPLETION_PATHS = ("/v1/completions", "/generate")
STOP_GRACE_S = 0.01
"""How long a stopping replica lets requests in flight finish: a crash gives them no time."""


@dataclass
class Replica:
    """A running reference server and the completion requests that reached it."""

    url: str
    runner: web.AppRunner
    received: list[str | None] = field(default_factory=list)
    """The ``X-Request-Id`` of every completion request that reached the server, in order."""
    traceparents: list[str | None] = field(default_factory=list)
    """The ``traceparent`` of each of those requests."""
    tracestates: list[str | None] = field(default_factory=list)
    """The ``tracestate`` of each of those requests."""
    stopped: bool = False

    @property
    def engine(self) -> Engine:
        app = self.runner.app
        assert isinstance(app, web.Application)
        return app[STATE].engine

    async def stop(self) -> None:
        """Stop listening and end the requests in flight at once (idempotent)."""
        if not self.stopped:
            self.stopped = True
            await self.runner.cleanup()


@contextlib.asynccontextmanager
async def serve_replica(**fields: Any) -> AsyncIterator[Replica]:
    """Serve a reference server of ``fields`` (ReferenceConfig) on a free 127.0.0.1 port."""
    app = create_app(ReferenceConfig(**fields))
    received: list[str | None] = []
    traceparents: list[str | None] = []
    tracestates: list[str | None] = []

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in COMPLETION_PATHS:
            received.append(request.headers.get("X-Request-Id"))
            traceparents.append(request.headers.get("traceparent"))
            tracestates.append(request.headers.get("tracestate"))
        return await handler(request)

    app.middlewares.insert(0, count)
    # servers.reference.serve gives requests in flight 5 s to finish; a replica that goes
    # down ends them at once.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=STOP_GRACE_S)
    await runner.setup()
    replica: Replica | None = None
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = int(runner.addresses[0][1])
        url = f"http://127.0.0.1:{port}"
        replica = Replica(
            url=url,
            runner=runner,
            received=received,
            traceparents=traceparents,
            tracestates=tracestates,
        )
        yield replica
    finally:
        await (replica.stop() if replica is not None else runner.cleanup())


@contextlib.asynccontextmanager
async def serve_handler(
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A scripted replica (a misbehaving server or proxy): ``handler`` answers every POST, on
    a free 127.0.0.1 port. Yields its base URL."""
    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class Stall:
    """Holds a replica's engine before each forward pass until :meth:`release` (bounded).

    ``entered`` is set once a forward pass is held: a request has reached the engine.
    """

    HOLD_LIMIT_S = 30.0

    def __init__(self, replica: Replica) -> None:
        self.entered = asyncio.Event()
        self._released = threading.Event()
        loop = asyncio.get_running_loop()

        def hold(info: StepInfo) -> None:
            if not self._released.is_set():
                loop.call_soon_threadsafe(self.entered.set)
                self._released.wait(self.HOLD_LIMIT_S)

        replica.engine.step_hooks.append(hold)

    def release(self) -> None:
        """Let the engine run on, now and for every later forward pass."""
        self._released.set()

    async def __aenter__(self) -> Stall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def samples(n: int, prefix: str = "s", prompt: str = "Question: what is 6 * 7?") -> list[Sample]:
    """``n`` samples with ids ``<prefix>0 .. <prefix>{n-1}``."""
    return [Sample(id=f"{prefix}{i}", prompt=f"{prompt} #{i}") for i in range(n)]
