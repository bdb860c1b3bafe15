"""Request handling shared by every route: logging, injected faults, the real servers'
authentication rules and their routing-error bodies."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from servers.reference.config import ReferenceConfig
from servers.reference.errors import detail, internal_error
from servers.reference.state import STATE

logger = structlog.get_logger("servers.reference")

_VLLM_PROTECTED = ("/v1", "/v2", "/inference", "/cohere")
"""vLLM's ``--api-key`` guards only these path prefixes; profile routes stay open."""
_SGLANG_OPEN = ("/health", "/metrics")
"""SGLang's ``--api-key`` guards everything but these."""


def middlewares() -> list[Middleware]:
    """The middleware chain of a reference server, outermost first."""
    return [_log, _faults, _auth, _routing_errors]


def needs_key(cfg: ReferenceConfig, path: str) -> bool:
    """Whether the real server of ``cfg.dialect`` asks for the API key on ``path``."""
    if cfg.api_key is None:
        return False
    if cfg.dialect == "vllm":
        return path.startswith(_VLLM_PROTECTED)
    return not path.startswith(_SGLANG_OPEN)


@web.middleware
async def _log(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    logger.debug(
        "request",
        method=request.method,
        path=request.path,
        status=response.status,
        seconds=round(time.perf_counter() - started, 4),
    )
    return response


@web.middleware
async def _faults(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    faults = state.cfg.faults
    path = request.path
    if path in faults.crash_on:
        logger.warning("fault: crashing the process", path=path)
        sys.stderr.flush()
        os._exit(1)
    if path in faults.fail_routes:
        logger.warning("fault: failing route", path=path)
        return internal_error()
    if request.match_info.http_exception is None:
        if path == "/start_profile" and faults.start_delay_s:
            await asyncio.sleep(faults.start_delay_s)
        elif path == "/stop_profile":
            if faults.hang_stop:
                logger.warning("fault: stop hangs")
                await state.closing.wait()
                raise web.HTTPServiceUnavailable()  # only when the server shuts down
            if faults.stop_delay_s:
                await asyncio.sleep(faults.stop_delay_s)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    cfg = request.app[STATE].cfg
    if (
        needs_key(cfg, request.path)
        and request.headers.get("Authorization") != f"Bearer {cfg.api_key}"
    ):
        return web.json_response({"error": "Unauthorized"}, status=401)
    return await handler(request)


@web.middleware
async def _routing_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return detail(404, "Not Found")
    except web.HTTPMethodNotAllowed:
        return detail(405, "Method Not Allowed")
