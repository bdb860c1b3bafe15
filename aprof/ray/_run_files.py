"""The files of a run as one host holds them below ``save_path``: listed, hashed and read in
pieces, never through a link (a link planted below ``save_path`` is named, not followed).

What a node of a Ray cluster answers when the driver collects the run (``aprof.ray``), and
what the driver lists of its own host.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import BinaryIO

from aprof._safe_files import TEMP_SUFFIX, open_folder, open_regular

MAX_LISTED = 100_000
"""Entries (files, folders, links) one listing looks at: a run writes far fewer."""
READ_BYTES = 1 << 20
"""What a hash reads at a time."""


@dataclass
class Listing:
    """What one host holds below ``save_path``."""

    files: dict[str, int] = field(default_factory=dict)
    """Size in bytes of each regular file, by its path relative to ``save_path``."""
    links: list[str] = field(default_factory=list)
    """Links found below it (not followed), and anything else that is not a file or folder."""
    truncated: bool = False
    """More than ``MAX_LISTED`` entries: the listing stopped there."""
    shared: bool = False
    """The host sees the driver's own ``manifest.json`` of this run: its files are the driver's
    (shared storage)."""


def list_below(root: str, run_id: str | None = None) -> Listing:
    """The files below ``root`` (none when it does not exist; temporary files left out); with
    ``run_id``, ``shared`` says whether ``root`` holds that run's ``manifest.json``."""
    found = Listing()
    if run_id is not None:
        found.shared = _holds_run(root, run_id)
        if found.shared:
            return found
    try:
        top = open_folder(root, [], create=False)
    except FileNotFoundError:
        return found
    seen = 0
    pending: list[tuple[int, str]] = [(top, "")]
    try:
        while pending:
            fd, prefix = pending.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > MAX_LISTED:
                            found.truncated = True
                            return found
                        _take(entry, fd, prefix, found, pending)
            finally:
                os.close(fd)
    finally:
        for fd, _ in pending:
            os.close(fd)
    return found


def _take(
    entry: os.DirEntry[str], fd: int, prefix: str, found: Listing, pending: list[tuple[int, str]]
) -> None:
    path = f"{prefix}{entry.name}"
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        try:
            pending.append((open_folder_at(fd, entry.name), f"{path}/"))
        except OSError:  # swapped for a link, or gone, since it was listed
            found.links.append(path)
    elif stat.S_ISREG(info.st_mode):
        if not entry.name.endswith(TEMP_SUFFIX):
            found.files[path] = info.st_size
    else:
        found.links.append(path)


def open_folder_at(fd: int, name: str) -> int:
    """The folder ``name`` in ``fd``, never through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=fd)


def digest_below(root: str, path: str) -> tuple[int, str]:
    """The size and SHA-256 (hex) of the file ``path`` below ``root``."""
    digest = hashlib.sha256()
    size = 0
    with _open_below(root, path) as file:
        while chunk := file.read(READ_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def read_below(root: str, path: str, offset: int, size: int) -> bytes:
    """At most ``size`` bytes of the file ``path`` below ``root`` from ``offset`` (fewer at
    its end)."""
    with _open_below(root, path) as file:
        return os.pread(file.fileno(), size, offset)


def _open_below(root: str, path: str) -> BinaryIO:
    parts = PurePosixPath(path).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or PurePosixPath(path).is_absolute():
        raise ValueError(f"not a path below save_path: {path!r}")
    folder = open_folder(root, parts[:-1], create=False)
    try:
        return open_regular(parts[-1], dir_fd=folder)
    finally:
        os.close(folder)


def _holds_run(root: str, run_id: str) -> bool:
    try:
        folder = open_folder(root, [], create=False)
    except OSError:
        return False
    try:
        with open_regular("manifest.json", dir_fd=folder) as file:
            head = file.read(4096)  # the run id comes first, after the schema
    except OSError:
        return False
    finally:
        os.close(folder)
    return f'"run_id": "{run_id}"'.encode() in head
