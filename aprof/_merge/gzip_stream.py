"""The merged file's gzip stream, made of parts compressed apart: the merging process's own
text and the worker processes' parts (``parallel.py``), each a raw deflate stream that ends on
a full flush (no final block, no back-reference before it), laid one after another as they
are. The gzip trailer's CRC-32 of the whole is combined from each part's (zlib's
``crc32_combine``, which Python's ``zlib`` does not offer), so no part is decompressed or
compressed twice.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

LEVEL: Final = 1
"""Speed over ratio, as the timeline."""
CHUNK: Final = 1 << 20
_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
"""A gzip member's header: deflate, no name, no time, unknown system."""
_POLYNOMIAL: Final = 0xEDB88320


@dataclass(frozen=True)
class Deflated:
    """A part compressed apart: raw deflate ending on a full flush, read from ``chunks``; the
    CRC-32 and length of the text it holds."""

    chunks: Iterable[bytes]
    crc: int
    size: int


class PartWriter:
    """Compresses one part of the merged text (raw deflate, ending on a full flush)."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
        self.crc = 0
        self.size = 0

    def write(self, text: bytes) -> bytes:
        self.crc = zlib.crc32(text, self.crc)
        self.size += len(text)
        return self._deflate.compress(text)

    def end(self, *, last: bool = False) -> bytes:
        """The rest of the part: up to a full flush, or the stream's final block."""
        return self._deflate.flush(zlib.Z_FINISH if last else zlib.Z_FULL_FLUSH)


def gzip_stream(pieces: Iterable[bytes | Deflated]) -> Iterator[bytes]:
    """One gzip member of ``pieces``: text compressed here, parts compressed apart laid in."""
    yield _HEADER
    crc, size = 0, 0
    own = PartWriter()
    buffered: list[bytes] = []
    held = 0
    for piece in pieces:
        if not isinstance(piece, Deflated):
            buffered.append(piece)
            held += len(piece)
            if held >= CHUNK:
                yield own.write(b"".join(buffered))
                buffered, held = [], 0
            continue
        yield own.write(b"".join(buffered)) + own.end()
        buffered, held = [], 0
        yield from piece.chunks
        crc = crc32_combine(crc32_combine(crc, own.crc, own.size), piece.crc, piece.size)
        size += own.size + piece.size
        own = PartWriter()
    yield own.write(b"".join(buffered)) + own.end(last=True)
    crc, size = crc32_combine(crc, own.crc, own.size), size + own.size
    yield struct.pack("<II", crc, size & 0xFFFFFFFF)


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of two texts one after the other, from each one's and the second's length
    (zlib's algorithm: the first CRC moved past ``length2`` zero bytes by squaring a GF(2)
    operator, then the second added)."""
    if length2 <= 0:
        return crc1
    odd = [_POLYNOMIAL] + [1 << n for n in range(31)]  # one zero bit
    even = _square(odd)  # two
    odd = _square(even)  # four
    while True:
        even = _square(odd)  # the next power of two zero bits, as bytes: 1, 4, 16, ...
        if length2 & 1:
            crc1 = _times(even, crc1)
        length2 >>= 1
        if not length2:
            break
        odd = _square(even)
        if length2 & 1:
            crc1 = _times(odd, crc1)
        length2 >>= 1
        if not length2:
            break
    return crc1 ^ crc2


def _times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _square(matrix: list[int]) -> list[int]:
    return [_times(matrix, matrix[n]) for n in range(32)]
