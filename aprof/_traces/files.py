"""Chrome trace JSON files (``.json``, or ``.json.gz`` as torch and aprof write it): which files
are traces (and which of SGLang's are its ranks' or its own merged copy), opening one below
``save_path`` following no link, reading one of aprof's own timeline parts whole, and why one
could not be read, in a few words. A window's traces, of any size, are read event by event by
``aprof._traces.stream``.

Standard library only (and ``aprof._safe_files``, ``aprof._errors``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import zlib
from pathlib import PurePosixPath
from typing import Any

from aprof._errors import NotRegularFileError, UnsafePathError, describe
from aprof._safe_files import open_folder, read_up_to


def is_trace_json(path: str) -> bool:
    """Whether ``path`` names a Chrome trace JSON file (``.json`` or ``.json.gz``)."""
    return path.endswith((".json", ".json.gz"))


_SGLANG_RANKS = re.compile(
    r"-TP-(?P<TP>\d+)(?:-DP-(?P<DP>\d+))?(?:-PP-(?P<PP>\d+))?(?:-EP-(?P<EP>\d+))?"
    r"(?:-(?P<stage>EXTEND|DECODE))?\.trace\.json(?:\.gz)?$"
)
_SGLANG_MERGED = re.compile(r"^merged-.*\.trace\.json(?:\.gz)?$")


def sglang_ranks(path: str) -> str | None:
    """The ranks of an SGLang trace as SGLang names them in its file name (``TP 0 DP 1 PP 0
    EP 2``, and its stage with ``profile_by_stage``); ``None`` for another file."""
    found = _SGLANG_RANKS.search(PurePosixPath(path).name)
    if found is None:
        return None
    parts = [f"{kind} {found[kind]}" for kind in ("TP", "DP", "PP", "EP") if found[kind]]
    if found["stage"]:
        parts.append(found["stage"])
    return " ".join(parts)


def without_merged_copy(paths: list[str]) -> list[str]:
    """``paths`` less SGLang's own merged trace (``merged-<id>.trace.json.gz``, its
    ``merge_profiles``) when the per-rank traces it merged are among them: read both, and
    every event would count twice."""
    merged = [p for p in paths if _SGLANG_MERGED.match(PurePosixPath(p).name)]
    if not merged or not any(sglang_ranks(p) for p in paths):
        return paths
    return [p for p in paths if p not in merged]


def open_below(root: str | os.PathLike[str], path: str) -> int:
    """A descriptor of the regular file ``path``, relative to ``root``, opened following no
    link below ``root`` (``root`` itself is the user's: a link there is followed); the caller
    closes it.

    Raises ``UnsafePathError`` (an ``OSError``) when ``path`` is absolute, climbs out with
    ``..``, or a link or something not a folder lies on the way, ``NotRegularFileError`` for
    a FIFO or a folder, and what opening raises.
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
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_trace_below(root: str | os.PathLike[str], path: str, limit: int) -> dict[str, Any]:
    """The JSON object of the trace at ``path`` (:func:`open_below`; the array form as
    ``{"traceEvents": [...]}``), which may hold at most ``limit`` bytes of JSON: for aprof's
    own timeline parts, read whole (a window's traces are read event by event:
    ``aprof._traces.stream``).

    Raises as :func:`open_below`, and ``ValueError`` for a larger file, JSON that is not a
    trace object or array, or invalid JSON; ``EOFError`` for a gzip stream cut short;
    ``zlib.error`` for a corrupt one.
    """
    fd = open_below(root, path)
    try:
        raw = read_up_to(fd, os.fstat(fd).st_size, limit)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise ValueError(f"more than {limit} bytes of trace JSON")
    return _parse(raw, path.endswith(".gz"), limit)


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
