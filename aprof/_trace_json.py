"""Reading a Chrome trace JSON file (``.json``, or ``.json.gz`` as torch and aprof write it),
bounded: what the merge and the servers' forward-step counters read traces with.

Standard library only (and ``aprof._safe_files``).
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from aprof._safe_files import FileTooLargeError, read_regular


def read_trace(path: str | os.PathLike[str], limit: int) -> dict[str, Any]:
    """The JSON object of the trace in the regular file ``path`` (the array form as
    ``{"traceEvents": [...]}``), which may hold at most ``limit`` bytes of JSON.

    Raises ``ValueError`` for a larger file, JSON that is not a trace object or array, or
    invalid JSON; ``EOFError`` for a gzip stream cut short; ``zlib.error`` for a corrupt one;
    ``OSError`` when it cannot be read (``NotRegularFileError`` for a FIFO or a folder).
    """
    try:
        raw = read_regular(path, limit)  # compressed JSON is no larger than the JSON
    except FileTooLargeError:
        raise ValueError(f"more than {limit} bytes of trace JSON") from None
    if os.fspath(path).endswith(".gz"):
        raw = _gunzip(raw, limit)
    data = json.loads(raw)
    if isinstance(data, list):
        return {"traceEvents": data}
    if not isinstance(data, dict):
        raise ValueError("not a Chrome trace: neither an object nor an array of events")
    return data


def _gunzip(raw: bytes, limit: int) -> bytes:
    """The JSON of the gzip members in ``raw``; at most ``limit`` bytes of it are made."""
    out = bytearray()
    while raw:
        inflate = zlib.decompressobj(wbits=31)
        out += inflate.decompress(raw, limit + 1 - len(out))
        if len(out) > limit:
            raise ValueError(f"more than {limit} bytes of trace JSON")
        if not inflate.eof:
            raise EOFError("truncated: the compressed stream ends early")
        raw = inflate.unused_data
    return bytes(out)
