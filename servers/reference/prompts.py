"""The prompts of a generation request, given as text or as token IDs, as token IDs.

The shapes are the real servers': vLLM's ``prompt`` is a string, a list of strings, a list of
token IDs (one prompt) or a list of such lists; SGLang's ``text`` is a string or a list of
strings and its ``input_ids`` a list of token IDs or a list of such lists.
"""

from __future__ import annotations

import json
from typing import Any

from aprof import AprofError
from servers.reference.tokenizer import VOCAB, encode

Prompts = tuple[list[list[int]], bool]
"""The token IDs of each prompt, and whether the request gave one prompt (not a list)."""


class BadPrompt(AprofError, ValueError):
    """A prompt field is unusable; the message names the field and says why."""


def parse(value: object, field: str, *, text: bool = True, ids: bool = True) -> Prompts:
    """The prompts in ``value``, which may be text (if ``text``) or token IDs (if ``ids``).

    Raises :class:`BadPrompt` for another shape, an empty prompt, or a token ID that is not
    in the vocabulary.
    """
    items = value if isinstance(value, list) else None
    if text and isinstance(value, str):
        return [_encoded(value, field)], True
    if text and items and all(isinstance(item, str) for item in items):
        return [_encoded(item, f"{field}[{i}]") for i, item in enumerate(items)], False
    if ids and items and all(_is_int(item) for item in items):
        return [_checked(items, field)], True
    if ids and items and all(isinstance(item, list) for item in items):
        return [_checked(item, f"{field}[{i}]") for i, item in enumerate(items)], False
    if items == []:
        raise BadPrompt(f"{field} cannot be an empty list")
    shapes = ["a non-empty string", "a list of strings"] if text else []
    shapes += ["a list of token IDs", "a list of token-ID lists"] if ids else []
    raise BadPrompt(f"{field} must be {', '.join(shapes[:-1])} or {shapes[-1]}")


def _encoded(prompt: str, field: str) -> list[int]:
    if not prompt:
        raise BadPrompt(f"{field} cannot be empty")
    return encode(prompt)


def _checked(ids: list[Any], field: str) -> list[int]:
    if not ids:
        raise BadPrompt(f"{field} cannot be an empty list")
    last = len(VOCAB) - 1
    for token in ids:
        if not _is_int(token):
            raise BadPrompt(f"{field} must hold only integer token IDs, got {json.dumps(token)}")
        if token < 0:
            raise BadPrompt(f"{field}: token ID {token} is negative; token IDs are 0 to {last}")
        if token > last:
            # vLLM refuses it too: "Token id N is out of vocabulary".
            raise BadPrompt(
                f"{field}: token ID {token} is out of vocabulary; token IDs are 0 to {last}"
            )
    return ids


def _is_int(value: object) -> bool:
    # JSON true and false arrive as bool, a subclass of int; neither is a token ID.
    return isinstance(value, int) and not isinstance(value, bool)
