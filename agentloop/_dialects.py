"""The two completion APIs as the servers speak them: request bodies and answers.

``openai``: ``POST /v1/completions`` (vLLM, SGLang and others) with ``prompt`` as text or
token IDs. The answer holds ``choices[0].text`` and ``finish_reason`` and ``usage``;
streamed, each ``data`` event is a chunk whose ``choices[0].text`` is the new text, usage
comes in a last chunk with empty ``choices`` when ``stream_options.include_usage`` is set,
and ``[DONE]`` ends the stream.

``sglang``: SGLang's native ``POST /generate`` with ``text`` (or, for token IDs,
``input_ids``) and ``sampling_params`` (``max_new_tokens``). The answer holds ``text`` and
``meta_info`` (``finish_reason`` as an object with a ``type``, ``prompt_tokens``,
``completion_tokens``); streamed, each event carries the whole text so far, and ``[DONE]``
ends the stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentloop._errors import BadAnswer, PromptError

Api = Literal["openai", "sglang"]
"""Which completion API a replica is spoken to in."""

DONE = "[DONE]"
"""The payload that ends a stream, in both APIs."""


@dataclass(slots=True)
class Answer:
    """A completion as it is read, whole or chunk by chunk."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def stop_strings(stop: str | Sequence[str]) -> list[str]:
    """``stop`` as a list: a single string is one stop string, not its characters."""
    return [stop] if isinstance(stop, str) else list(stop)


def path(api: Api) -> str:
    """The route a completion is posted to."""
    return "/v1/completions" if api == "openai" else "/generate"


def token_ids(prompt: Sequence[int]) -> list[int]:
    """``prompt`` as a list of token IDs; raises :class:`PromptError` (a ``ValueError``)
    unless it is a non-empty sequence of integers >= 0."""
    ids = list(prompt)
    if not ids:
        raise PromptError("a token-ID prompt must hold at least one token ID")
    for token in ids:
        # bool is a subclass of int, but True is no token ID.
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise PromptError(f"a token-ID prompt holds integers >= 0, got {token!r}")
    return ids


def body(
    api: Api,
    prompt: str | list[int],
    *,
    model: str | None,
    max_tokens: int,
    temperature: float | None,
    stop: str | Sequence[str],
    stream: bool,
) -> dict[str, Any]:
    """The JSON body of one completion request; ``prompt`` is text or checked token IDs,
    ``stop`` is one string or several."""
    stops = stop_strings(stop)
    if api == "openai":
        payload: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
        if model is not None:
            payload["model"] = model
        if temperature is not None:
            payload["temperature"] = temperature
        if stops:
            payload["stop"] = stops
        if stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        return payload
    params: dict[str, Any] = {"max_new_tokens": max_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    if stops:
        params["stop"] = stops
    field = "text" if isinstance(prompt, str) else "input_ids"
    payload = {field: prompt, "sampling_params": params}
    if stream:
        payload["stream"] = True
    return payload


def read_whole(api: Api, data: object) -> Answer:
    """The completion in a whole (not streamed) answer."""
    answer = Answer()
    if api == "openai":
        _openai_chunk(answer, data, whole=True)
    else:
        _sglang_chunk(answer, data)
    return answer


def read_chunk(api: Api, answer: Answer, data: object) -> None:
    """Add one streamed chunk to ``answer``."""
    if api == "openai":
        _openai_chunk(answer, data, whole=False)
    else:
        _sglang_chunk(answer, data)


def _openai_chunk(answer: Answer, data: object, *, whole: bool) -> None:
    obj = _object(data, "the answer")
    _raise_error(obj)
    choices = obj.get("choices")
    if not isinstance(choices, list) or (whole and not choices):
        raise BadAnswer("the answer has no 'choices' list")
    if choices:
        choice = _object(choices[0], "choices[0]")
        text = choice.get("text")
        if not isinstance(text, str):
            raise BadAnswer("choices[0].text is not a string")
        answer.text += text
        reason = choice.get("finish_reason")
        if reason is not None:
            answer.finish_reason = str(reason)
    usage = obj.get("usage")
    if isinstance(usage, Mapping):
        answer.prompt_tokens = _count(usage, "prompt_tokens")
        answer.completion_tokens = _count(usage, "completion_tokens")


def _sglang_chunk(answer: Answer, data: object) -> None:
    obj = _object(data, "the answer")
    _raise_error(obj)
    text = obj.get("text")
    if not isinstance(text, str):
        raise BadAnswer("the answer has no 'text' string")
    answer.text = text  # SGLang streams the whole text so far
    meta = obj.get("meta_info")
    if not isinstance(meta, Mapping):
        raise BadAnswer("the answer has no 'meta_info' object")
    reason = meta.get("finish_reason")
    if isinstance(reason, Mapping):
        answer.finish_reason = str(reason.get("type"))
    elif isinstance(reason, str):
        answer.finish_reason = reason
    answer.prompt_tokens = _count(meta, "prompt_tokens")
    answer.completion_tokens = _count(meta, "completion_tokens")


def _object(data: object, what: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise BadAnswer(f"{what} is not a JSON object")
    return data


def _raise_error(obj: Mapping[str, Any]) -> None:
    # Both servers put an "error" object (or string) into a stream that fails midway.
    error = obj.get("error")
    if error is not None:
        message = error.get("message", error) if isinstance(error, Mapping) else error
        raise BadAnswer(f"the server reported an error: {message}")


def _count(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
