"""The reference model's vocabulary: a newline and the printable ASCII characters."""

from __future__ import annotations

VOCAB = "\n" + "".join(chr(code) for code in range(32, 127))
"""The token of id ``i`` is ``VOCAB[i]``."""
MAX_MODEL_LEN = 512
"""Longest sequence (prompt plus completion) the model accepts."""

_UNKNOWN = VOCAB.index("?")
_INDEX = {char: index for index, char in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Token ids of ``text``; characters outside the vocabulary become ``?``."""
    return [_INDEX.get(char, _UNKNOWN) for char in text]


def decode(ids: list[int]) -> str:
    """The text of token ids."""
    return "".join(VOCAB[i] for i in ids)
