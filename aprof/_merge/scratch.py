"""A merge's own folder below its output folder, for every file it writes before the file is
whole: the workers' part files and the merged step's trace and archive, renamed into the
output folder once written.

The folder is named for its merge (``.aprof-merge.<pid>.<token>``) and holds a ``lock`` file
that the merge keeps locked (``flock``) while it runs; its workers inherit the lock's
descriptor, so the lock is held while any process of the merge lives, and the kernel lets go
of it when the last one dies, however it dies. Each merge first removes the folders whose lock
it can take: leftovers of merges that were killed. A folder whose lock is held (a merge
running in another process) is left as it is; pids are only shown, never trusted. No link is
followed: a folder is opened with ``O_NOFOLLOW``, and what is in it is unlinked, never opened.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import secrets
from typing import BinaryIO, Final

from aprof._safe_files import create_exclusive, replacing

PREFIX: Final = ".aprof-merge."
"""How the name of every merge's folder begins."""
LOCK: Final = "lock"
"""The file a live merge keeps locked, in its folder."""
_NAME: Final = re.compile(r"\.aprof-merge\.\d+\.[0-9a-f]{16}")
_LOOKED_AT: Final = 100_000
"""Entries of the output folder looked at for leftovers, at most (a folder of millions of
files costs no more than this)."""
_REMOVED_PER_FOLDER: Final = 100_000
"""Files of one leftover folder removed, at most (a merge writes a few per step)."""
_TRIES: Final = 8
_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Scratch:
    """This merge's folder in the output folder ``out`` (a descriptor, kept open by the
    caller), made locked after the leftovers of dead merges there are removed; removed by
    :meth:`close`. Raises ``OSError`` when it cannot be made."""

    def __init__(self, out: int) -> None:
        self.removed = remove_leftovers(out)
        """Leftover folders of dead merges removed on the way."""
        self._out = out
        for _ in range(_TRIES):
            made = _make(out)
            if made is not None:
                self.name, self.fd, self.lock = made
                return
        raise OSError(errno.EAGAIN, "cannot make a merge folder in the output folder")

    def replacing(self, name: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A new file to write here, renamed to ``name`` in the output folder (replacing what
        is there, a link too, never following it) once the block ends without an exception,
        removed if it raises."""
        return replacing(self.fd, name, into=self._out)

    def remove(self, name: str) -> None:
        """Remove ``name`` from this folder, if it is there."""
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.fd)

    def close(self) -> None:
        """Remove the folder and what is in it, then let go of the lock; once."""
        if self.fd < 0:
            return
        _empty(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(LOCK, dir_fd=self.fd)
        with contextlib.suppress(OSError):
            os.rmdir(self.name, dir_fd=self._out)
        os.close(self.fd)
        os.close(self.lock)  # the workers' copies are gone with them
        self.fd = self.lock = -1


def remove_leftovers(out: int) -> int:
    """Remove the folders of merges no process holds any more from the output folder ``out``
    (at most :data:`_LOOKED_AT` entries looked at); how many were removed."""
    removed = 0
    with os.scandir(out) as entries:
        names = [e.name for e in itertools.islice(entries, _LOOKED_AT) if _NAME.fullmatch(e.name)]
    for name in names:
        removed += _remove_if_dead(out, name)
    return removed


def _remove_if_dead(out: int, name: str) -> bool:
    try:
        folder = os.open(name, _DIR, dir_fd=out)
    except OSError:  # a link, not a folder, or gone: not a merge's folder to remove
        return False
    try:
        try:
            lock = os.open(LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except FileNotFoundError:  # being made (or emptied) right now: only an empty one goes
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=out)
            return False
        except OSError:
            return False
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its merge, or one of its workers, is alive
                return False
            _empty(folder)  # the lock last: a cleaner killed midway leaves it to the next
            with contextlib.suppress(OSError):
                os.unlink(LOCK, dir_fd=folder)
            try:
                os.rmdir(name, dir_fd=out)
            except OSError:
                return False
            return True
        finally:
            os.close(lock)
    finally:
        os.close(folder)


def _make(out: int) -> tuple[str, int, int] | None:
    """A new folder of this merge in ``out``, open, with its lock held; ``None`` when a
    cleaner removed it meanwhile (try again under another name)."""
    name = f"{PREFIX}{os.getpid()}.{secrets.token_hex(8)}"
    os.mkdir(name, 0o700, dir_fd=out)
    folder = lock = -1
    try:
        folder = os.open(name, _DIR, dir_fd=out)
        lock = create_exclusive(folder, LOCK)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # A cleaner may have taken the lock first, removed the folder and let go since:
        # the folder is ours only if it is still there, with this lock in it.
        there = os.stat(LOCK, dir_fd=folder, follow_symlinks=False).st_ino
        held = os.stat(name, dir_fd=out, follow_symlinks=False).st_ino
        if there == os.fstat(lock).st_ino and held == os.fstat(folder).st_ino:
            return name, folder, lock
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EWOULDBLOCK):
            for fd in (lock, folder):
                if fd >= 0:
                    os.close(fd)
            raise
    for fd in (lock, folder):
        if fd >= 0:
            os.close(fd)
    return None


def _empty(folder: int) -> None:
    """Unlink what ``folder`` holds but its lock (a link is unlinked, not followed; a folder,
    which no merge makes there, is left)."""
    with os.scandir(folder) as entries:
        names = [e.name for e in itertools.islice(entries, _REMOVED_PER_FOLDER) if e.name != LOCK]
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
