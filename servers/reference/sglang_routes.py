"""SGLang's HTTP routes: ``/start_profile`` and ``/stop_profile`` (GET or POST, always
registered), ``/server_info`` and the model-info routes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from servers.reference.errors import internal_error
from servers.reference.sglang_scheduler import (
    ProfileRequest,
    SglangSchedulerProfiler,
    default_profile_id,
)
from servers.reference.state import STATE, ServerState
from servers.reference.tokenizer import MAX_MODEL_LEN

logger = structlog.get_logger("servers.reference")

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose profiling behaviour this dialect follows."""


class _StartBody(BaseModel):
    """SGLang's ``ProfileReq`` fields; numeric strings are coerced, unknown fields ignored."""

    model_config = ConfigDict(extra="ignore")

    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_by_stage: bool = False
    profile_id: str | None = None
    merge_profiles: bool = False  # one rank: nothing to merge
    profile_prefix: str | None = None
    profile_stages: list[str] | None = None  # used only by SGLang's experimental profiler
    detailed_annotations: bool = False


class SglangProfiling:
    """The tokenizer-manager side: turns HTTP calls into scheduler profiler calls."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self.scheduler = SglangSchedulerProfiler()
        state.engine.step_hooks.append(self.scheduler.step)
        default = state.cfg.profiler_dir
        self._default_dir = default if default is not None else Path(tempfile.gettempdir())

    async def start(self, request: web.Request) -> web.Response:
        """``/start_profile``: 200 "Start profiling.", 500 when the scheduler refuses."""
        raw = await request.read()
        try:
            body = _StartBody.model_validate_json(raw) if raw.strip() else _StartBody()
        except ValidationError as exc:
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            body_error = {
                "object": "error",
                "message": message,
                "type": "Bad Request",
                "param": None,
                "code": 400,
            }
            return web.json_response(body_error, status=400)
        profile = ProfileRequest(
            output_dir=Path(body.output_dir) if body.output_dir else self._default_dir,
            profile_id=body.profile_id or default_profile_id(),
            prefix=body.profile_prefix,
            activities=tuple(body.activities if body.activities is not None else ("CPU", "GPU")),
            with_stack=body.with_stack is not False,
            record_shapes=body.record_shapes is not False,
            num_steps=body.num_steps,
            start_step=body.start_step,
            by_stage=body.profile_by_stage,
        )
        failure = await self._state.engine.call(lambda: self.scheduler.start(profile))
        if failure is not None:
            # The tokenizer manager raises RuntimeError; SGLang has no handler for it.
            logger.warning("sglang: start refused", reason=failure)
            return internal_error()
        logger.info(
            "sglang: profiling started",
            profile_id=profile.profile_id,
            num_steps=profile.num_steps,
            start_step=profile.start_step,
        )
        return web.Response(text="Start profiling.\n")

    async def stop(self, request: web.Request) -> web.Response:
        """``/stop_profile``: answers once the trace is written; 500 with nothing running."""
        failure, files = await self._state.engine.call(self.scheduler.stop)
        if failure is not None:
            logger.warning("sglang: stop refused", reason=failure)
            return internal_error()
        logger.info("sglang: profiling stopped", files=[str(f) for f in files])
        return web.Response(text="Stop profiling. This will take some time.\n")

    def shutdown(self) -> None:
        """Drop a running capture (engine thread)."""
        self.scheduler.shutdown()


PROFILING = web.AppKey("sglang_profiling", SglangProfiling)


def add_routes(app: web.Application, state: ServerState) -> None:
    """Register SGLang's profile and info routes."""
    profiling = SglangProfiling(state)
    app[PROFILING] = profiling
    for path, handler in (("/start_profile", profiling.start), ("/stop_profile", profiling.stop)):
        app.router.add_route("GET", path, handler)
        app.router.add_route("POST", path, handler)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)


async def server_info(request: web.Request) -> web.Response:
    """Server arguments and version, as SGLang's ``/server_info`` reports them."""
    cfg = request.app[STATE].cfg
    return web.json_response(
        {
            "version": SGLANG_VERSION,
            "model_path": cfg.model_name,
            "served_model_name": cfg.model_name,
            "tp_size": 1,
            "dp_size": 1,
            "context_length": MAX_MODEL_LEN,
            "enable_metrics": True,
            "internal_states": [{}],
        }
    )


async def model_info(request: web.Request) -> web.Response:
    """The served model, as SGLang's ``/model_info`` reports it."""
    cfg = request.app[STATE].cfg
    return web.json_response({"model_path": cfg.model_name, "is_generation": True})
