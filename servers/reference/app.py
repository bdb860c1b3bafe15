"""The reference server's aiohttp application and the context manager that serves it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from servers.reference import completion_routes, sglang_routes, vllm_routes
from servers.reference.config import ReferenceConfig
from servers.reference.engine import Engine, StepInfo
from servers.reference.metrics import Metrics
from servers.reference.middleware import middlewares
from servers.reference.state import STATE, ServerState

logger = structlog.get_logger("servers.reference")


def create_app(cfg: ReferenceConfig) -> web.Application:
    """An aiohttp application serving ``cfg``; its engine starts with the application."""
    app = web.Application(middlewares=middlewares())
    engine = Engine(
        seed=cfg.seed,
        separate_prefill=cfg.dialect == "sglang",
        annotate=_vllm_iteration_label if cfg.dialect == "vllm" else _sglang_step_label,
    )
    state = ServerState(cfg=cfg, engine=engine, metrics=Metrics(engine))
    app[STATE] = state
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    completion_routes.add_routes(app, cfg.dialect)
    if cfg.dialect == "vllm":
        vllm_routes.add_routes(app, state)
    else:
        sglang_routes.add_routes(app, state)
    app.on_startup.append(_start_engine)
    app.on_shutdown.append(_closing)
    app.on_cleanup.append(_close_engine)
    return app


@dataclass(frozen=True)
class ReferenceServer:
    """A running reference server."""

    cfg: ReferenceConfig
    host: str
    port: int
    app: web.Application

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def forward_steps(self) -> int:
        """The engine's forward-step counter (iterations since start)."""
        return self.app[STATE].engine.forward_steps

    @property
    def profiler_dir(self) -> Path | None:
        """Where vLLM traces go; SGLang's default ``output_dir`` (None: the system temp dir)."""
        return self.cfg.profiler_dir


@contextlib.asynccontextmanager
async def serve(
    cfg: ReferenceConfig, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[ReferenceServer]:
    """Serve ``cfg`` on ``host:port`` (port 0: a free one) until the block exits."""
    app = create_app(cfg)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        server = ReferenceServer(cfg=cfg, host=host, port=int(bound[1]), app=app)
        logger.info(
            "reference server listening",
            url=server.url,
            dialect=cfg.dialect,
            vllm_version=cfg.vllm_version if cfg.dialect == "vllm" else None,
        )
        yield server
    finally:
        await runner.cleanup()


async def health(request: web.Request) -> web.Response:
    """200 with an empty body while the server runs."""
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text, with the forward-step counter of the dialect."""
    state = request.app[STATE]
    text = state.metrics.render(state.cfg.dialect, state.cfg.model_name)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


def _vllm_iteration_label(info: StepInfo) -> str:
    # vLLM labels each iteration by its new (context) and running (generation) requests.
    return (
        f"execute_context_{info.prefill_seqs}({info.prefill_tokens})"
        f"_generation_{info.decode_seqs}({info.decode_seqs})"
    )


def _sglang_step_label(info: StepInfo) -> str:
    # SGLang (0.5.23, observed) wraps each forward pass in one user annotation named by its
    # forward mode and batch: step[EXTEND bs=1 toks=1], step[DECODE bs=1].
    if info.kind == "decode":
        return f"step[DECODE bs={info.decode_seqs}]"
    mode = "EXTEND" if info.kind == "prefill" else "MIXED"
    return f"step[{mode} bs={info.prefill_seqs + info.decode_seqs} toks={info.tokens}]"


async def _start_engine(app: web.Application) -> None:
    await app[STATE].engine.start()


async def _closing(app: web.Application) -> None:
    app[STATE].closing.set()


async def _close_engine(app: web.Application) -> None:
    state = app[STATE]
    profiler = app.get(vllm_routes.FRONTEND) or app.get(sglang_routes.PROFILING)
    if profiler is not None:
        await state.engine.call(profiler.shutdown)
    await state.engine.close()
