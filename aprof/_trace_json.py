"""Reading a Chrome trace JSON file (``.json``, or ``.json.gz`` as torch and aprof write it),
bounded, and the clock it is on: what the merge, the report and the servers' forward-step
counters read traces with.

Standard library only (and ``aprof._safe_files``, ``aprof._errors``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import zlib
from pathlib import PurePosixPath
from typing import Any

from aprof._errors import FileTooLargeError, NotRegularFileError, UnsafePathError, describe
from aprof._safe_files import open_folder, read_regular, read_up_to


def is_trace_json(path: str) -> bool:
    """Whether ``path`` names a Chrome trace JSON file (``.json`` or ``.json.gz``)."""
    return path.endswith((".json", ".json.gz"))


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
    return _parse(raw, os.fspath(path).endswith(".gz"), limit)


def read_trace_below(root: str | os.PathLike[str], path: str, limit: int) -> dict[str, Any]:
    """:func:`read_trace` of ``path``, relative to ``root``, following no link below ``root``
    (``root`` itself is the user's: a link there is followed).

    Raises as :func:`read_trace`, and ``UnsafePathError`` (an ``OSError``) when ``path`` is
    absolute, climbs out with ``..``, or a link or something not a folder lies on the way.
    """
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UnsafePathError(errno.EINVAL, "outside save_path")
    folder = open_folder(os.fspath(root), rel.parts[:-1], create=False)
    try:
        fd = os.open(
            rel.name,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
            dir_fd=folder,
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(errno.ELOOP, "a link: not followed below save_path") from None
        raise
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file")
        raw = read_up_to(fd, info.st_size, limit)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise ValueError(f"more than {limit} bytes of trace JSON")
    return _parse(raw, rel.name.endswith(".gz"), limit)


def _parse(raw: bytes, gz: bool, limit: int) -> dict[str, Any]:
    if gz:
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


ABSOLUTE_US = 1e15
"""``ts`` above this many µs (2001 on) are taken as µs since the epoch."""


def time_base(data: dict[str, Any], events: list[dict[str, Any]]) -> int:
    """The wall-clock time in ns that a ``ts`` of 0 in this trace stands for: its
    ``baseTimeNanoseconds`` (aprof's timelines, Kineto), else 0 when its ``ts`` are µs since
    the epoch (vLLM's frontend trace); ``ValueError`` when it is on no known clock."""
    base = data.get("baseTimeNanoseconds")
    if isinstance(base, int) and not isinstance(base, bool):
        return base
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    if stamps and min(stamps) > ABSOLUTE_US:
        return 0
    raise ValueError("on no known clock (no baseTimeNanoseconds, ts not since the epoch)")


def unreadable(exc: BaseException) -> str:
    """Why a trace could not be read, in a few words (for a note or a problem line)."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, EOFError):
        return "truncated (the compressed stream ends early)"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at byte {exc.pos}): truncated or damaged"
    if isinstance(exc, zlib.error):
        return f"corrupt compressed data ({exc})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, ValueError):
        return str(exc)
    return describe(exc)
