"""The output layout under ``save_path``: safe names, window folders, relative paths, and
the only ways aprof makes folders and writes files there (no link below it is followed)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from aprof._errors import UnsafeNameError, UnsafePathError
from aprof._safe_files import (
    create_exclusive,
    open_folder,
    stale_temp_files,
    temp_name,
    write_file,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_DOTS = re.compile(r"\.{2,}")


def safe_name(name: str) -> str:
    """``name`` reduced to ``[A-Za-z0-9_.-]``, with no ``..`` and no leading dot."""
    cleaned = _DOTS.sub("_", _UNSAFE.sub("_", name)).lstrip(".")
    if not cleaned.strip("_"):
        raise UnsafeNameError(f"{name!r} has no path-safe characters")
    return cleaned[:120]


def size_of(path: Path) -> int | None:
    """Bytes of a file, or of every file under a folder; ``None`` if it is not there."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size
    except OSError:  # gone, or going while we look
        return None


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it is already path-safe, else raise ``UnsafeNameError`` (a
    ``ValueError``) saying why."""
    if not isinstance(name, str) or not name:
        raise UnsafeNameError(f"{what} must be a non-empty string, got {name!r}")
    if safe_name(name) != name:
        raise UnsafeNameError(
            f"{what} {name!r} is not path-safe: use letters, digits, '_', '-' and '.', "
            f"no '..' and no leading dot (for example {safe_name(name)!r})"
        )
    return name


class OutputLayout:
    """Where every window of a run writes, all inside one root folder."""

    def __init__(self, save_path: Path) -> None:
        self.root = Path(os.path.abspath(save_path))
        """The run's folder; it may itself be a link (the user's), nothing below it may."""

    def rollout_dir(self, step: int, replica: int) -> Path:
        """``step_<n>/rollout/replica_<r>/``."""
        return self.root / f"step_{step}" / "rollout" / f"replica_{replica}"

    def role_dir(self, step: int, role: str, rank: int | None) -> Path:
        """``step_<n>/<role>/rank_<k>/``, or ``step_<n>/<role>/`` for a whole worker group."""
        folder = self.root / f"step_{step}" / safe_name(role)
        return folder if rank is None else folder / f"rank_{rank}"

    def absolute(self, path: Path) -> Path:
        """``path`` made absolute, relative paths taken from the root."""
        return Path(os.path.abspath(self.root / path))

    def relative(self, path: Path) -> str:
        """``path`` relative to the root when it lies inside, else absolute (POSIX form)."""
        full = self.absolute(path)
        if full.is_relative_to(self.root):
            return full.relative_to(self.root).as_posix()
        return full.as_posix()

    def check_writable(self) -> None:
        """Create the root and prove a file can be written there; raise ``OSError`` if not."""
        self.root.mkdir(parents=True, exist_ok=True)
        folder = open_folder(str(self.root), (), create=False)
        try:
            probe = temp_name("probe")
            os.close(create_exclusive(folder, probe))
            os.unlink(probe, dir_fd=folder)
        finally:
            os.close(folder)

    def make_dir(self, path: Path) -> Path:
        """Create the folder ``path`` below the root; ``OSError`` (``UnsafePathError`` for a
        link or a file in the way) if it cannot be made there."""
        os.close(open_folder(str(self.root), self.parts(path), create=True))
        return path

    def remove_empty_dir(self, path: Path) -> None:
        """Remove the folder ``path`` below the root if it is empty, following no link;
        ``OSError`` if it is not there, not empty or not safe to reach."""
        *folders, name = self.parts(path)
        parent = open_folder(str(self.root), folders, create=False)
        try:
            os.rmdir(name, dir_fd=parent)
        finally:
            os.close(parent)

    def write(self, path: Path, data: bytes, *, keep_previous: bool = False) -> None:
        """Replace the file ``path`` below the root atomically with ``data``, making its
        folders (with ``keep_previous``, a file there is first renamed aside, named for its
        time); ``OSError`` if it cannot be written there."""
        *folders, name = self.parts(path)
        write_file(str(self.root), folders, name, data, keep_previous=keep_previous)

    def parts(self, path: Path) -> tuple[str, ...]:
        """The names leading from the root to ``path``; ``UnsafePathError`` (an ``OSError``)
        if it lies outside."""
        full = self.absolute(path)
        if not full.is_relative_to(self.root) or full == self.root:
            raise UnsafePathError(f"{full} does not lie inside save_path {self.root}")
        return full.relative_to(self.root).parts

    def remove_stale_temp_files(self) -> int:
        """Remove the temporary files that killed processes of this host left below the root
        (bounded walk); returns how many."""
        removed = 0
        for path in stale_temp_files(str(self.root), depth=4, limit=100_000):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
        return removed
