"""Text generation routes: OpenAI ``/v1/completions`` and ``/v1/models`` (both dialects) and
SGLang's native ``/generate`` (SGLang dialect).

Each route passes the client's request id (the ``X-Request-Id`` header, which vLLM honours too;
on ``/generate`` a string ``rid`` in the body first, SGLang's own field) to the engine, which
names it in the forward steps that serve the request while a profiler records."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from aprof import AprofError
from servers.reference.engine import Sequence, SequenceFailed
from servers.reference.errors import openai_error
from servers.reference.prompts import BadPrompt, parse
from servers.reference.state import STATE, ServerState
from servers.reference.tokenizer import MAX_MODEL_LEN, decode

_DEFAULT_MAX_TOKENS = 16  # vLLM's /v1/completions default
_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default
REQUEST_ID_HEADER = "X-Request-Id"
"""The client's request id, named in the forward steps that serve the request."""


class _BadRequest(AprofError):
    """The request body is unusable; the message says why."""


def add_routes(app: web.Application, dialect: str) -> None:
    """Register the generation routes of ``dialect``."""
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    if dialect == "sglang":
        app.router.add_post("/generate", generate)


async def models(request: web.Request) -> web.Response:
    """The one served model, as ``/v1/models`` lists it."""
    cfg = request.app[STATE].cfg
    card = {
        "id": cfg.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": cfg.dialect,
        "root": cfg.model_name,
        "parent": None,
        "max_model_len": MAX_MODEL_LEN,
    }
    return web.json_response({"object": "list", "data": [card]})


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI text completion, whole or streamed as server-sent events."""
    state = request.app[STATE]
    try:
        body = await _json_object(request)
        model = body.get("model")
        if state.cfg.dialect == "vllm" and model is not None and model != state.cfg.model_name:
            return openai_error(
                404, f"The model `{model}` does not exist.", "NotFoundError", "model"
            )
        prompts, _ = parse(body.get("prompt"), "prompt")
        max_tokens = _positive_int(body.get("max_tokens"), "max_tokens", _DEFAULT_MAX_TOKENS)
        stream = bool(body.get("stream", False))
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise _BadRequest("stream_options must be an object")
        include_usage = bool(options.get("include_usage", False))
        seqs = _submit(state, prompts, max_tokens, request.headers.get(REQUEST_ID_HEADER))
    except (_BadRequest, BadPrompt) as exc:
        return openai_error(400, str(exc), "BadRequestError")
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.cfg.model_name,
    }
    try:
        if not stream:
            await _until_finished(seqs)
            choices = [_choice(i, decode(seq.output), "length") for i, seq in enumerate(seqs)]
            return web.json_response({**head, "choices": choices, "usage": _usage(seqs)})
        response = await _open_stream(request)
        async for index, token in _merged(seqs):
            finish = "length" if seqs[index].finished else None
            await _send(response, {**head, "choices": [_choice(index, decode([token]), finish)]})
        if include_usage:
            await _send(response, {**head, "choices": [], "usage": _usage(seqs)})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    finally:
        for seq in seqs:
            if not seq.finished:
                seq.abort()


async def generate(request: web.Request) -> web.StreamResponse:
    """SGLang's native generation: ``text`` or ``input_ids``, and
    ``sampling_params.max_new_tokens``."""
    state = request.app[STATE]
    try:
        body = await _json_object(request)
        text, input_ids = body.get("text"), body.get("input_ids")
        if (text is None) == (input_ids is None):
            raise _BadRequest("Either text or input_ids should be provided.")  # SGLang's words
        if text is not None:
            prompts, single = parse(text, "text", ids=False)
        else:
            prompts, single = parse(input_ids, "input_ids", text=False)
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise _BadRequest("sampling_params must be an object")
        max_new = _positive_int(
            params.get("max_new_tokens"), "max_new_tokens", _DEFAULT_MAX_NEW_TOKENS
        )
        stream = bool(body.get("stream", False))
        rid = body.get("rid")
        client_id = rid if isinstance(rid, str) else request.headers.get(REQUEST_ID_HEADER)
        seqs = _submit(state, prompts, max_new, client_id)
    except (_BadRequest, BadPrompt) as exc:
        return web.json_response(
            {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400},
            status=400,
        )
    try:
        if not stream:
            await _until_finished(seqs)
            outputs = [_sglang_output(seq) for seq in seqs]
            return web.json_response(outputs[0] if single else outputs)
        response = await _open_stream(request)
        async for index, _token in _merged(seqs):
            output = _sglang_output(seqs[index])
            await _send(response, output if single else {**output, "index": index})
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    finally:
        for seq in seqs:
            if not seq.finished:
                seq.abort()


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as exc:
        raise _BadRequest(f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    return body


def _positive_int(value: object, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _BadRequest(f"{field} must be an integer >= 1, got {value!r}")
    return value


def _submit(
    state: ServerState, prompts: list[list[int]], max_tokens: int, client_id: str | None
) -> list[Sequence]:
    for ids in prompts:
        if len(ids) + max_tokens > MAX_MODEL_LEN:
            raise _BadRequest(
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you "
                f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion."
            )
    return [state.engine.submit(ids, max_tokens, client_id) for ids in prompts]


async def _until_finished(seqs: list[Sequence]) -> None:
    async for _ in _merged(seqs):
        pass


async def _merged(seqs: list[Sequence]) -> AsyncIterator[tuple[int, int]]:
    """``(sequence index, token)`` pairs of all ``seqs`` in the order they are generated."""
    queue: asyncio.Queue[tuple[int, int] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, seq: Sequence) -> None:
        try:
            async for token in seq.tokens():
                queue.put_nowait((index, token))
            queue.put_nowait(None)
        except SequenceFailed as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(i, seq)) for i, seq in enumerate(seqs)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def _open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(payload)}\n\n".encode())


def _choice(index: int, text: str, finish: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }


def _usage(seqs: list[Sequence]) -> dict[str, int]:
    prompt = sum(len(seq.prompt) for seq in seqs)
    completion = sum(len(seq.output) for seq in seqs)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def _sglang_output(seq: Sequence) -> dict[str, Any]:
    finish = {"type": "length", "length": len(seq.output)} if seq.finished else None
    return {
        "text": decode(seq.output),
        "output_ids": list(seq.output),
        "meta_info": {
            "id": seq.id,
            "finish_reason": finish,
            "prompt_tokens": len(seq.prompt),
            "completion_tokens": len(seq.output),
            "cached_tokens": 0,
        },
    }
