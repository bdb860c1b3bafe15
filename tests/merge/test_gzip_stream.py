"""The merged file's gzip stream made of parts compressed apart (``aprof._merge.gzip_stream``):
any mix of text compressed by the merging process and parts compressed by workers decompresses
to the text in order, with gzip's own check (CRC-32 and length) right."""

from __future__ import annotations

import gzip
import zlib

from hypothesis import given
from hypothesis import strategies as st

from aprof._merge.gzip_stream import Deflated, PartWriter, crc32_combine, gzip_stream


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc32_combine_is_the_crc_of_the_two_texts_one_after_the_other(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def _part(text: bytes, pieces: int) -> Deflated:
    writer = PartWriter()
    step = max(1, len(text) // pieces)
    chunks = [writer.write(text[i : i + step]) for i in range(0, len(text), step)]
    return Deflated([*chunks, writer.end()], writer.crc, writer.size)


@given(
    st.lists(
        st.tuples(
            st.booleans(), st.binary(max_size=2000) | st.just(b"ab" * 40_000), st.integers(1, 4)
        ),
        max_size=8,
    )
)
def test_parts_compressed_apart_make_one_gzip_stream_of_the_text_in_order(
    pieces: list[tuple[bool, bytes, int]],
) -> None:
    made = [_part(text, n) if apart else text for apart, text, n in pieces]
    data = b"".join(gzip_stream(made))
    # gzip.decompress checks the trailer: the combined CRC-32 and the length.
    assert gzip.decompress(data) == b"".join(text for _, text, _ in pieces)
