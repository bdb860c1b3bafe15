"""Writing inside one root folder without ever following a link below it.

Folders are opened one level at a time with ``O_NOFOLLOW`` and every later call works relative
to the folder's descriptor, so a link planted anywhere below the root (or swapped in while
aprof writes) is refused, never followed. Files are replaced atomically through a temporary
file created exclusively under an unpredictable name that says which host and process made
it, so that a later run can remove what a killed one left behind.

Standard library and ``aprof._errors`` only: the timeline's writer process (``python -I -S``)
loads both by path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

from aprof._errors import FileTooLargeError, NotRegularFileError, UnsafePathError

TEMP_SUFFIX = ".aprof-tmp"
"""Every temporary file aprof writes ends so."""
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
_TEMP = re.compile(r"^\..*\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{16}\.aprof-tmp$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_regular(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` if it holds at most ``limit``.

    With ``dir_fd``, ``path`` is a name in that folder and a link there is not followed.
    Raises what :func:`open_regular` raises, and ``FileTooLargeError``.
    """
    with open_regular(path, dir_fd=dir_fd) as file:
        data = read_up_to(file.fileno(), os.fstat(file.fileno()).st_size, limit)
    if len(data) > limit:
        raise FileTooLargeError(errno.EFBIG, f"larger than {limit} bytes")
    return data


def open_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> BinaryIO:
    """The regular file ``path``, open for reading (buffered).

    With ``dir_fd``, ``path`` is a name in that folder and a link there is not followed.
    Raises ``NotRegularFileError`` (without waiting: a FIFO is not opened for a writer),
    ``UnsafePathError`` for a link (with ``dir_fd``), other ``OSError`` when it cannot be
    opened, and ``ValueError`` for a name holding a NUL.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if dir_fd is not None:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if dir_fd is not None and exc.errno == errno.ELOOP:
            raise UnsafePathError(
                errno.ELOOP, "a symbolic link: aprof follows no link below save_path"
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for is_kind, name in _FILE_KINDS if is_kind(info.st_mode)), "?")
            raise NotRegularFileError(errno.EINVAL, f"not a regular file: {kind}")
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def read_up_to(fd: int, size: int, limit: int) -> bytes:
    """The bytes of ``fd`` (a regular file ``size`` bytes long as ``fstat`` said), at most
    ``limit + 1`` of them: more than ``limit`` means too large. The memory taken follows what
    the file holds, not ``limit`` (a file may also have grown since ``fstat``)."""
    with open(fd, "rb", closefd=False) as file:
        data = file.read(min(size, limit) + 1)
        if len(data) <= min(size, limit):
            return data  # its end
        chunks, total = [data], len(data)
        while total <= limit:
            chunk = file.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    return b"".join(chunks)


def append_file(folder: int, name: str, data: bytes) -> None:
    """Append ``data`` to the regular file ``name`` in ``folder`` (made if missing), following
    no link; raises ``OSError`` (``NotRegularFileError`` for anything but a regular file)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, f"{name}: not a regular file")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def open_folder(root: str, parts: Sequence[str], *, create: bool) -> int:
    """A descriptor of ``root/parts...``, made (root too) if ``create``; raises ``UnsafePathError``
    when one of ``parts`` is a link or not a folder. ``root`` itself is the user's: a link
    there is followed. The caller closes the descriptor."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise
        os.makedirs(root, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = root
        for part in parts:
            where = os.path.join(where, part)
            try:
                inner = _open_inner(fd, part, create)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _unsafe(where, part, fd) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_inner(fd: int, part: str, create: bool) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # made meanwhile by another process
        os.mkdir(part, 0o777, dir_fd=fd)
    return os.open(part, _DIR_FLAGS, dir_fd=fd)


def _unsafe(where: str, part: str, fd: int) -> UnsafePathError:
    try:
        mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
    except OSError:
        mode = 0
    what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
    return UnsafePathError(
        errno.ELOOP if stat.S_ISLNK(mode) else errno.ENOTDIR,
        f"{where} is {what}: aprof writes only into folders of its own below save_path "
        "and follows no link there",
    )


def vacant(path: os.PathLike[str] | str) -> str:
    """``path`` as text, once it is sure nothing is there: for a tool that writes a file by
    name (torch's exports) and would follow a link planted at that name."""
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "aprof does not write over what is there", str(path))
    return os.fspath(path)


class HeldFolder:
    """A folder below ``root`` held open for a writer that writes by path (a capture tool).

    ``path`` names the folder through its descriptor (``/proc/self/fd/<fd>``), so a link later
    swapped in on the way is not followed. :meth:`check`, before each write, makes sure the
    folder still lies where it was opened; if not, ``path`` leads nowhere from then on (the
    descriptor is pointed at ``/dev/null``), so what the writer tries fails instead of landing
    outside ``root``. Where there is no ``/proc``, ``path`` is the plain path: a swap is then
    found, but not kept from being followed.
    """

    def __init__(self, root: str, parts: Sequence[str]) -> None:
        self._root, self._parts = root, tuple(parts)
        self._fd = open_folder(root, self._parts, create=True)
        self._identity = _identity(self._fd)
        proc = f"/proc/self/fd/{self._fd}"
        self.path = proc if os.path.isdir(proc) else os.path.join(root, *self._parts)
        """The folder, for a writer that opens files by name."""

    def check(self) -> str | None:
        """``None`` while the folder lies where it was opened; else why not."""
        try:
            fd = open_folder(self._root, self._parts, create=False)
            same = _identity(fd) == self._identity
            os.close(fd)
            if same:
                return None
            why = f"{os.path.join(self._root, *self._parts)} was replaced while capturing"
        except OSError as exc:
            why = f"{exc.strerror or exc}"
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(null, self._fd, inheritable=False)  # the writer's path leads nowhere now
        os.close(null)
        return why

    def close(self) -> None:
        """Let go of the folder; once."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def temp_name(name: str) -> str:
    """A fresh, unpredictable name for a temporary file that will become ``name``."""
    return f".{name}.{_HOST}.{os.getpid()}.{secrets.token_hex(8)}{TEMP_SUFFIX}"


def create_exclusive(folder: int, name: str) -> int:
    """A descriptor of the new file ``name`` in ``folder``; fails if anything is there."""
    return os.open(name, _NEW_FILE, 0o644, dir_fd=folder)


def replace_file(folder: int, name: str, chunks: Iterable[bytes]) -> int:
    """Replace ``name`` in ``folder`` atomically with ``chunks``; returns the bytes written.

    A reader sees the old file or the new one, whole. A link at ``name`` is replaced, not
    followed.
    """
    size = 0
    with replacing(folder, name) as out:
        for chunk in chunks:
            out.write(chunk)
            size += len(chunk)
    return size


@contextlib.contextmanager
def replacing(folder: int, name: str, *, into: int | None = None) -> Iterator[BinaryIO]:
    """A new file to write, which replaces ``name`` in ``folder`` atomically once the block
    ends without an exception (and is removed if it raises), as :func:`replace_file`. With
    ``into``, the file is made in ``folder`` and replaces ``name`` in the folder ``into``
    (on the same file system) instead."""
    tmp = temp_name(name)
    fd = create_exclusive(folder, tmp)
    try:
        with os.fdopen(fd, "wb", closefd=True) as out:
            yield out
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder if into is None else into)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def write_file(
    root: str, parts: Sequence[str], name: str, data: bytes, *, keep_previous: bool = False
) -> None:
    """Replace ``root/parts.../name`` atomically with ``data``, making the folders; with
    ``keep_previous`` a file already there is first renamed aside (:func:`move_aside`)."""
    folder = open_folder(root, parts, create=True)
    try:
        if keep_previous:
            move_aside(folder, name)
        replace_file(folder, name, (data,))
    finally:
        os.close(folder)


def move_aside(folder: int, name: str) -> str | None:
    """Rename ``name`` in ``folder`` (an earlier run's file) to ``<stem>.<its time><ext>``,
    where ``<ext>`` is everything from the first dot; returns the new name, ``None`` if
    there was nothing to move."""
    try:
        mtime = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return None
    stem, dot, ext = name.partition(".")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(mtime))
    kept = f"{stem}.{stamp}{dot}{ext}"
    n = 1
    while exists(folder, kept):
        kept, n = f"{stem}.{stamp}-{n}{dot}{ext}", n + 1
    os.rename(name, kept, src_dir_fd=folder, dst_dir_fd=folder)
    return kept


def exists(folder: int, name: str) -> bool:
    """Something (a link too) is at ``name`` in ``folder``."""
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def stale_temp_files(root: str, *, depth: int, limit: int) -> Iterator[str]:
    """Temporary files below ``root`` (``depth`` folders down, at most ``limit`` entries
    looked at) left by a process of this host that has ended."""
    seen = 0
    for folder, dirs, files in os.walk(root):  # os.walk follows no link to a folder
        level = 0 if folder == root else os.path.relpath(folder, root).count(os.sep) + 1
        if level >= depth:
            dirs.clear()
        for name in files:
            seen += 1
            match = _TEMP.match(name)
            if match and match["host"] == _HOST and not _alive(int(match["pid"])):
                yield os.path.join(folder, name)
        seen += len(dirs)
        if seen >= limit:
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True
