"""Trace files on disk: finding a window's traces and moving them into the window's folder.

Shared by the HTTP adapters (``servers.vllm``, ``servers.sglang``) and the in-process engines
(``servers.engines``). vLLM writes every capture into the one trace folder fixed at its launch,
so a window's files are picked out of it (by name prefix, else by modification time) and moved;
SGLang writes each capture into the folder the window names, so its files are only listed.
The forward steps a capture holds are counted from its per-step annotations (bounded reads).
Every function here does blocking file-system work: call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from aprof._safe_files import create_exclusive, exists, open_folder
from aprof._traces.iterations import SGLANG_STEP, VLLM_ITERATION
from aprof._traces.stream import Fields, open_trace

TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".profiler_out.txt")
"""The file names vLLM gives a capture's traces (torch traces and the summary table)."""
NPU_DIR_SUFFIX = "_ascend_pt"
"""torch_npu (vLLM-Ascend, SGLang-NPU) writes one folder per rank instead of a trace file."""

_SGLANG_TRACE = re.compile(r"\.trace\.json(\.gz)?$")
_WORKER_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")
_MTIME_SLACK_NS = 2_000_000_000  # some file systems keep modification times in 2 s steps
_PREFIX_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def vllm_prefix(prefix: str) -> str:
    """``prefix`` as vLLM accepts it for ``profile_prefix`` (1-128 of ``[A-Za-z0-9._-]``,
    first a letter or digit); vLLM names the capture's files ``<prefix>_...``."""
    cleaned = _PREFIX_UNSAFE.sub("-", prefix).lstrip("._-")[:128]
    return cleaned or "aprof"


def listing(folder: Path | None) -> dict[str, int] | None:
    """Entry name -> modification time (ns) of ``folder``, ``None`` if it is not reachable.

    Taken at a capture's start, it tells :func:`relocate` which files the capture wrote.
    """
    if folder is None or not folder.is_dir():
        return None
    entries = {}
    with os.scandir(folder) as it:
        for entry in it:
            try:
                entries[entry.name] = entry.stat().st_mtime_ns
            except FileNotFoundError:
                continue  # removed while listing
    return entries


def relocate(
    source: Path,
    dest: Path,
    prefix: str | None,
    before: dict[str, int] | None,
    since_ns: int,
    *,
    root: Path | None = None,
) -> tuple[list[Path], list[Path]] | None:
    """Move a window's traces from the server's trace folder ``source`` into ``dest``.

    The window's traces are those named ``<prefix>_...`` when ``prefix`` is given, else those
    new or rewritten since the :func:`listing` ``before`` and modified after ``since_ns``.
    Nothing is written through a link: a trace that is a link, or whose name is taken in
    ``dest``, stays where it is, and so does every trace when ``dest``, or a folder between
    ``root`` (``save_path``, given by ``Window.root``) and it, is a link. Returns (moved,
    could not be moved), or ``None`` when ``source`` is not reachable.
    """
    now = listing(source)
    if now is None:
        return None
    earlier = before or {}
    chosen = []
    for name, mtime in sorted(now.items()):
        if not _is_trace(name, (source / name).is_dir()):
            continue
        if prefix is not None:
            if name.startswith(prefix + "_"):
                chosen.append(name)
        elif earlier.get(name) != mtime and mtime >= since_ns - _MTIME_SLACK_NS:
            chosen.append(name)
    try:  # from save_path (``root``) down, so that no link on the way is followed
        into = (
            os.open(dest, _FOLDER)
            if root is None
            else open_folder(str(root), dest.relative_to(root).parts, create=False)
        )
    except (OSError, ValueError):  # a link, not a folder, or not below root: nothing goes there
        return [], [source / name for name in chosen]
    moved: list[Path] = []
    kept: list[Path] = []
    try:
        for name in chosen:
            if _move(source / name, into, name):
                moved.append(dest / name)
            else:
                kept.append(source / name)
    finally:
        os.close(into)
    return moved, kept


def _move(source: Path, folder: int, name: str) -> bool:
    """Move ``source`` to ``name`` in ``folder`` (a descriptor); ``False``, leaving it in
    place, when it is a link or ``name`` is taken. Follows no link, replaces nothing."""
    try:
        mode = os.lstat(source).st_mode
        if stat.S_ISLNK(mode):
            return False  # what it points at is not the server's trace
        if stat.S_ISDIR(mode):
            # A rename replaces an empty folder at the destination: look first.
            if exists(folder, name):
                return False
            os.rename(source, name, dst_dir_fd=folder)
        else:
            # Unlike a rename, a link fails when the name is taken.
            os.link(source, name, dst_dir_fd=folder, follow_symlinks=False)
            os.unlink(source)
        return True
    except FileExistsError:
        return False
    except OSError:
        pass  # across devices, or a file system without links: copy
    try:
        _copy(source, folder, name)
    except OSError:
        return False
    # The copy is whole: a source that cannot be removed only stays behind as well.
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(mode):
            shutil.rmtree(source)
        else:
            os.unlink(source)
    return True


def _copy(source: Path, folder: int, name: str) -> None:
    """Copy the file or folder ``source`` to ``name`` in ``folder``, creating every entry
    anew (nothing there is replaced or followed); what it made is removed if it fails."""
    mode = os.lstat(source).st_mode
    if stat.S_ISDIR(mode):  # torch_npu's *_ascend_pt folders
        os.mkdir(name, 0o777, dir_fd=folder)
        try:
            inner = os.open(name, _FOLDER, dir_fd=folder)
            try:
                with os.scandir(source) as entries:
                    for entry in entries:
                        _copy(Path(entry.path), inner, entry.name)
            finally:
                os.close(inner)
        except BaseException:
            shutil.rmtree(name, dir_fd=folder, ignore_errors=True)
            raise
    elif stat.S_ISREG(mode):
        with open(source, "rb", opener=_no_follow) as reader:
            writer = os.fdopen(create_exclusive(folder, name), "wb")
            try:
                with writer:
                    shutil.copyfileobj(reader, writer)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=folder)
                raise
    else:
        raise OSError(errno.EINVAL, "neither a file nor a folder: not copied", str(source))


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def outputs(folder: Path, npu: bool) -> tuple[Path, ...]:
    """The files a capture wrote into its own ``folder`` (sorted): its trace files, or with
    ``npu`` its torch_npu ``*_ascend_pt`` folders; ``()`` if the folder is not there."""
    if not folder.is_dir():
        return ()
    # Hidden names are files still being written (exported under a temporary name).
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    if npu:
        return tuple(sorted(p for p in entries if p.name.endswith(NPU_DIR_SUFFIX)))
    return tuple(sorted(p for p in entries if p.is_file()))


def _is_trace(name: str, is_dir: bool) -> bool:
    if name.startswith("."):
        return False  # a file still being written under a temporary name
    return name.endswith(NPU_DIR_SUFFIX) if is_dir else name.endswith(TRACE_SUFFIXES)


MAX_TRACE_BYTES = 256 * 2**20
"""The most of a trace's JSON read to count its steps, uncompressed (a few seconds; SGLang
advises traces under ~100 MB); a larger one counts as unreadable and the counter is used
instead. Read event by event: memory does not grow with it."""


class _Named(msgspec.Struct):
    """The keys of a trace event the counters read (the others are skipped unread)."""

    cat: object = None
    name: object = None


_NAMED: Final = Fields(_Named)


def _annotations(path: str | os.PathLike[str], limit: int, matches: Callable[[str], object]) -> int:
    """The CPU-side user annotations (``record_function`` ranges) whose name ``matches`` in a
    Chrome trace (``.json`` or ``.json.gz``), reading at most ``limit`` bytes of its JSON.
    Raises ``ValueError`` for a larger file or one that is not a trace, and what reading
    raises (``OSError``, ``EOFError``, ``zlib.error``), also for a file cut short."""
    count = 0
    with open_trace(path, _NAMED) as trace:
        for batch in trace.batches():
            if trace.json_bytes > limit:
                raise ValueError(f"{path}: more than {limit} bytes of trace JSON")
            count += sum(
                1 for event in batch if event.cat == "user_annotation" and matches(str(event.name))
            )
        if trace.stopped is not None:
            raise trace.stopped
    return count


def count_vllm_iterations(path: str | os.PathLike[str], *, limit: int = MAX_TRACE_BYTES) -> int:
    """The engine steps a vLLM worker trace holds (its per-iteration annotations)."""
    return _annotations(path, limit, VLLM_ITERATION.match)


def count_sglang_steps(path: str | os.PathLike[str], *, limit: int = MAX_TRACE_BYTES) -> int:
    """The forward passes an SGLang trace holds: one ``step[<MODE> bs=N ...]`` annotation
    each (EXTEND, DECODE, MIXED, VERIFY, DRAFT, IDLE), not ``scheduler.run_batch``, which
    also covers the batch that ends the capture."""
    return _annotations(path, limit, lambda name: name.startswith(SGLANG_STEP))


def _largest_count(traces: list[Path], count: Callable[[Path], int]) -> int | None:
    """The largest ``count`` of ``traces`` (each rank writes one of the same steps); ``None``
    if none is readable."""
    counts = []
    for path in traces:
        try:
            counts.append(count(path))
        except (OSError, EOFError, ValueError, zlib.error):  # unreadable, cut short, corrupt, large
            continue
    return max(counts) if counts else None


def is_vllm_worker_trace(path: Path) -> bool:
    """A worker's torch trace, not the front end's (``…async_llm…``) nor a summary table."""
    return bool(_WORKER_TRACE.search(path.name)) and ".async_llm." not in path.name


def vllm_steps_in(files: tuple[Path, ...] | list[Path]) -> int | None:
    """Engine steps a capture holds, counted in its worker traces; ``None`` if none is readable.

    Each rank writes one worker trace of the same engine steps, so the largest count is the
    capture's.
    """
    return _largest_count([f for f in files if is_vllm_worker_trace(f)], count_vllm_iterations)


def sglang_steps_in(files: tuple[Path, ...] | list[Path]) -> int | None:
    """Forward passes a capture holds, counted in its torch traces; ``None`` if none is
    readable.

    Each TP/DP rank writes one trace of the same forward passes, so the largest count is the
    capture's.
    """
    return _largest_count([f for f in files if _SGLANG_TRACE.search(f.name)], count_sglang_steps)
