"""vLLM's API-server routes: ``/version`` and, when profiling was enabled at launch,
``/start_profile`` and ``/stop_profile`` with the behaviour of the imitated version.

| version   | start body                    | 2nd start          | stop, nothing running |
|-----------|-------------------------------|--------------------|-----------------------|
| <= 0.29   | ignored                       | 200, front end restarts | 500              |
| 0.30-0.31 | ignored                       | 200, ignored       | 200                   |
| 0.32      | prefix, delay, max (validated) | 409 until a stop  | 200                   |
| >= 0.33   | the same plus profiler_kwargs | 409 until a stop   | 200                   |
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from aprof import AprofError
from servers.reference.engine import Sequence
from servers.reference.errors import internal_error, openai_error
from servers.reference.frontend_trace import FrontendTrace
from servers.reference.state import STATE, ServerState
from servers.reference.vllm_worker import ProfilerNotRunning, VllmWorkerProfiler, WorkerWindow

logger = structlog.get_logger("servers.reference")

_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PREFIX_RULE = (
    "profile_prefix must be 1-128 ASCII characters, start with a letter or digit, and "
    "contain only letters, digits, '.', '_' and '-'"
)
_CONFLICT = (
    "A profiling session is already active. Call /stop_profile before starting another session."
)


class _StartBody(BaseModel):
    """The 0.32 start body: strict types, unknown fields ignored, every field optional."""

    model_config = ConfigDict(strict=True, extra="ignore")

    profile_prefix: str | None = None
    delay_iterations: int | None = None
    max_iterations: int | None = None
    profiler_kwargs: Any = None  # a field from 0.33 on; before, an ignored unknown field


class _BadStart(AprofError):
    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class VllmFrontend:
    """The API-server side of vLLM profiling: front-end trace, 0.32's active flag and lock."""

    def __init__(self, state: ServerState) -> None:
        cfg = state.cfg
        assert cfg.profiler_dir is not None  # the config requires it with profiling
        self._state = state
        self._version = cfg.vllm_version_tuple
        self._directory = cfg.profiler_dir
        self.worker = VllmWorkerProfiler(
            version=cfg.vllm_version_tuple,
            directory=cfg.profiler_dir,
            instance_id=secrets.token_hex(3)[:5],
        )
        state.engine.step_hooks.append(self.worker.step)
        state.engine.finish_listeners.append(self._on_finish)
        self._trace: FrontendTrace | None = None
        self._prefix: str | None = None
        self._lock = asyncio.Lock()

    async def start(self, request: web.Request) -> web.Response:
        """``POST /start_profile``."""
        window = WorkerWindow(
            delay_iterations=self._state.cfg.launch_delay_iterations,
            max_iterations=self._state.cfg.launch_max_iterations,
        )
        if self._version >= (0, 32, 0):
            try:
                window = await self._read_body(request, window)
            except _BadStart as exc:
                return openai_error(400, str(exc), "BadRequestError", exc.param)
        async with self._lock:
            if self._version >= (0, 32, 0) and self._trace is not None:
                return openai_error(409, _CONFLICT, "Conflict")
            await self._state.engine.call(lambda: self.worker.start(window))
            if self._trace is None or self._version < (0, 30, 0):
                # Up to 0.29 the front end is a raw torch profiler: a second start begins anew.
                self._trace = FrontendTrace()
                self._prefix = window.prefix
        logger.info(
            "vllm: profiling started",
            prefix=window.prefix,
            delay=window.delay_iterations,
            max=window.max_iterations,
        )
        return web.Response(status=200)

    async def stop(self, request: web.Request) -> web.Response:
        """``POST /stop_profile``: answers once the traces are written."""
        async with self._lock:
            try:
                files = await self._state.engine.call(self.worker.stop)
                worker_failed = False
            except ProfilerNotRunning:
                files, worker_failed = [], True
            trace, self._trace = self._trace, None
            if trace is not None:
                trace.in_flight(self._state.engine.unfinished(), time.time_ns())
                files.append(await asyncio.to_thread(trace.write, self._frontend_path()))
        logger.info("vllm: profiling stopped", files=[str(f) for f in files])
        if (trace is None and self._version < (0, 30, 0)) or worker_failed:
            # A raw torch profiler stopped while not running raises: an unhandled 500.
            return internal_error()
        return web.Response(status=200)

    def shutdown(self) -> None:
        """Drop a running capture (engine thread)."""
        self.worker.shutdown()

    async def _read_body(self, request: web.Request, window: WorkerWindow) -> WorkerWindow:
        raw = await request.read()
        if not raw.strip():
            return window
        try:
            data = _StartBody.model_validate_json(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            loc = ".".join(str(part) for part in ("body", *error["loc"]))
            raise _BadStart(error["msg"], loc if error["loc"] else "body") from None
        if data.profile_prefix is not None and (
            not data.profile_prefix.isascii() or not _PREFIX.match(data.profile_prefix)
        ):
            raise _BadStart(f"{_PREFIX_RULE}; got {data.profile_prefix!r}", "body.profile_prefix")
        for name in ("delay_iterations", "max_iterations"):
            if (getattr(data, name) or 0) < 0:
                raise _BadStart(f"{name} must be greater than or equal to 0", f"body.{name}")
        kwargs = data.profiler_kwargs if self._version >= (0, 33, 0) else None
        if kwargs is not None and not isinstance(kwargs, dict):
            raise _BadStart("Input should be a valid dictionary", "body.profiler_kwargs")
        return WorkerWindow(
            delay_iterations=(
                window.delay_iterations if data.delay_iterations is None else data.delay_iterations
            ),
            max_iterations=(
                window.max_iterations if data.max_iterations is None else data.max_iterations
            ),
            prefix=data.profile_prefix,
            profiler_kwargs=kwargs,
        )

    def _frontend_path(self) -> Path:
        name = f"{socket.gethostname()}_{os.getpid()}.async_llm"
        if self._prefix and self._version >= (0, 32, 0):
            name = f"{self._prefix}_{name}"
        return self._directory / f"{name}.{time.time_ns()}.pt.trace.json.gz"

    def _on_finish(self, seq: Sequence) -> None:
        if self._trace is not None:
            self._trace.record(seq)


FRONTEND = web.AppKey("vllm_frontend", VllmFrontend)


def add_routes(app: web.Application, state: ServerState) -> None:
    """Register ``/version`` and, with profiling, the profile routes."""
    app.router.add_get("/version", version)
    if state.cfg.profiling:
        frontend = VllmFrontend(state)
        app[FRONTEND] = frontend
        app.router.add_post("/start_profile", frontend.start)
        app.router.add_post("/stop_profile", frontend.stop)


async def version(request: web.Request) -> web.Response:
    """``{"version": "X.Y.Z"}`` of the imitated release."""
    return web.json_response({"version": request.app[STATE].cfg.vllm_version})
