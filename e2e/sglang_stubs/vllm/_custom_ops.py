"""The one name SGLang imports from ``vllm._custom_ops`` on CPU; calling it is an error."""

from __future__ import annotations

from typing import NoReturn


def rotary_embedding(*args: object, **kwargs: object) -> NoReturn:
    """Never called on CPU: SGLang uses its native rotary embedding there."""
    raise RuntimeError("vllm._custom_ops.rotary_embedding is a stub of aprof's SGLang e2e")
