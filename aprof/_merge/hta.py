"""A step's per-rank torch traces as Holistic Trace Analysis reads them (HTA, the
``traceinsight`` package, ``import hta``): :func:`hta_trace_files` for
``TraceAnalysis(trace_files=...)``, and :func:`export_hta` for ``TraceAnalysis(trace_dir=...)``,
a folder of one trace per rank and nothing else.

The ranks come from aprof's layout: ``step_<n>/<role>/rank_<k>/captures.json``, which each
rank writes beside its traces (with or without a driver). HTA's folder mode tells a trace's
rank by the first ``"rank": <k>`` in its text (torch writes ``distributedInfo`` there when
``torch.distributed`` is initialized); a trace without it is copied with ``distributedInfo``
added, so every rank is set.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Final

from aprof._errors import ExportError
from aprof._safe_files import open_folder, read_regular, replace_file
from aprof._traces.files import is_trace_json, open_below, unreadable
from aprof._traces.stream import blocks, json_chunks

CAPTURES_FILE: Final = "captures.json"
MAX_CAPTURES_BYTES: Final = 16 << 20
_RANK_FOLDER = re.compile(r"rank_(\d+)")
_HTA_RANK = re.compile(rb'"rank":\s+(\d+)')
"""How HTA reads a trace's rank (``hta/common/trace_file.py``)."""
_HEAD_BYTES: Final = 1 << 20
"""How much of a trace's JSON is searched for its rank (torch writes it before the events)."""


def hta_trace_files(
    save_path: str | os.PathLike[str], step: int, role: str, *, stage: str | None = None
) -> dict[int, Path]:
    """Each rank's torch trace of ``role`` in ``step`` (of ``stage``, where the role captured
    stage by stage), by rank: what ``TraceAnalysis(trace_files=...)`` takes.

    Raises ``ExportError`` (a ``ValueError``) naming what is missing or ambiguous: no rank of
    the role in the step, a rank without a trace, a rank with several (name a ``stage``).
    """
    root = Path(save_path)
    found: dict[int, Path] = {}
    for rank, records in _ranks(root, step, role):
        paths = [
            f["path"]
            for r in records
            if r.get("state") == "done" and (stage is None or r.get("stage") == stage)
            for f in r.get("files", [])
            if isinstance(f, dict) and isinstance(f.get("path"), str) and is_trace_json(f["path"])
        ]
        if not paths:
            shown = f" of stage {stage!r}" if stage else ""
            raise ExportError(f"step {step}, {role} rank {rank}: no torch trace{shown}")
        if len(paths) > 1:
            stages = sorted({str(r.get("stage")) for r in records if r.get("state") == "done"})
            raise ExportError(
                f"step {step}, {role} rank {rank}: {len(paths)} traces (stages "
                f"{', '.join(stages)}): HTA takes one per rank; name a stage"
            )
        found[rank] = root / paths[0]
    return dict(sorted(found.items()))


def export_hta(
    save_path: str | os.PathLike[str],
    step: int,
    role: str,
    *,
    out: str | os.PathLike[str] | None = None,
    stage: str | None = None,
) -> tuple[Path, dict[int, Path]]:
    """A folder ``TraceAnalysis(trace_dir=...)`` reads as it is: ``rank_<k>.<suffix>`` per
    rank (a hard link to the trace where the file system allows, else a copy; a copy with
    ``distributedInfo`` added where the trace names no rank), nothing else. ``out`` defaults
    to ``save_path/hta/step_<n>/<role>``; a folder holding anything but an earlier export's
    traces is refused. Returns the folder and its traces by rank.

    Raises ``ExportError`` as :func:`hta_trace_files` and for a folder that is not empty.
    """
    root = Path(save_path)
    traces = hta_trace_files(root, step, role, stage=stage)
    where = (str(root), ["hta", f"step_{step}", role]) if out is None else (os.fspath(out), [])
    folder = open_folder(where[0], where[1], create=True)
    made: dict[int, Path] = {}
    try:
        _clear(folder, Path(where[0], *where[1]))
        for rank, source in traces.items():
            name = f"rank_{rank}{_suffix(source.name)}"
            path = source.relative_to(root).as_posix()
            try:
                _place(root, path, rank, folder, name)
            except (EOFError, zlib.error) as exc:  # read while copied: cut short or corrupt
                raise ExportError(f"{path}: {unreadable(exc)}") from None
            made[rank] = Path(where[0], *where[1], name)
    finally:
        os.close(folder)
    return Path(where[0], *where[1]), made


def _ranks(root: Path, step: int, role: str) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Each rank folder of ``role`` in ``step`` with its capture records."""
    parts = (f"step_{step}", role)
    if any(p in ("", ".", "..") or "/" in p for p in parts):
        raise ExportError(f"no role {role!r}")
    try:
        folder = open_folder(str(root), parts, create=False)
    except FileNotFoundError:
        raise ExportError(f"step {step} has no captures of role {role!r}") from None
    try:
        ranks = sorted(
            int(m.group(1)) for name in os.listdir(folder) if (m := _RANK_FOLDER.fullmatch(name))
        )
        if not ranks:
            raise ExportError(f"step {step}, {role}: no rank_<k> folder")
        for rank in ranks:
            path = f"rank_{rank}/{CAPTURES_FILE}"
            try:
                inner = open_folder(str(root), (*parts, f"rank_{rank}"), create=False)
                try:
                    data = read_regular(CAPTURES_FILE, MAX_CAPTURES_BYTES, dir_fd=inner)
                finally:
                    os.close(inner)
                records = json.loads(data)
            except (OSError, ValueError) as exc:
                raise ExportError(f"step {step}, {role} {path}: unreadable ({exc})") from None
            if not isinstance(records, list):
                raise ExportError(f"step {step}, {role} {path}: not a list of captures")
            yield rank, [r for r in records if isinstance(r, dict)]
    finally:
        os.close(folder)


def _suffix(name: str) -> str:
    return ".pt.trace.json.gz" if name.endswith(".gz") else ".pt.trace.json"


def _clear(folder: int, shown: Path) -> None:
    """Remove an earlier export's traces; refuse a folder holding anything else."""
    names = os.listdir(folder)
    others = [n for n in names if not re.fullmatch(r"rank_\d+\.pt\.trace\.json(\.gz)?", n)]
    if others:
        raise ExportError(
            f"{shown}: not empty ({', '.join(sorted(others)[:3])}): HTA would read it"
        )
    for name in names:
        os.unlink(name, dir_fd=folder)


def _place(root: Path, path: str, rank: int, folder: int, name: str) -> None:
    """The trace at ``path`` as ``name`` in ``folder``: linked, copied, or copied with its rank."""
    fd = open_below(root, path)
    try:
        if _names_rank(fd, path.endswith(".gz")) == rank:
            rel = PurePosixPath(path)
            source = open_folder(str(root), rel.parts[:-1], create=False)
            try:
                os.link(rel.name, name, src_dir_fd=source, dst_dir_fd=folder, follow_symlinks=False)
                return
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
            finally:
                os.close(source)
            replace_file(folder, name, blocks(fd))
        else:
            replace_file(folder, name, _with_rank(fd, path.endswith(".gz"), rank))
    finally:
        os.close(fd)


def _names_rank(fd: int, gz: bool) -> int | None:
    """The rank HTA would read from the trace (the first ``"rank": <k>`` in its head)."""
    head = os.pread(fd, _HEAD_BYTES, 0)
    if gz:
        with contextlib.suppress(zlib.error):
            head = zlib.decompressobj(wbits=31).decompress(head, _HEAD_BYTES)
    found = _HTA_RANK.search(head)
    return None if found is None else int(found.group(1))


def _with_rank(fd: int, gz: bool, rank: int) -> Iterator[bytes]:
    """The trace with ``"distributedInfo": {"rank": <rank>}`` first in its object (compressed
    again as it came), so HTA reads its rank."""
    deflate = zlib.compressobj(1, zlib.DEFLATED, 31) if gz else None
    head: bytes | None = b""  # the text until the object's first key is seen
    for text in json_chunks(fd, gz):
        if head is not None:
            head += text
            opened = re.match(rb"\s*\{\s*(.)", head, re.S)
            if opened is None:
                if len(head) > _HEAD_BYTES:
                    raise ExportError("a trace that is no JSON object: HTA cannot read it")
                continue
            comma = b"" if opened.group(1) == b"}" else b","
            at = opened.start(1)
            text = head[:at] + b'"distributedInfo": {"rank": %d}%s ' % (rank, comma) + head[at:]
            head = None
        yield text if deflate is None else deflate.compress(text)
    if head is not None:
        raise ExportError("a trace that is no JSON object: HTA cannot read it")
    if deflate is not None:
        yield deflate.flush()
