"""The control folder of a run, ``save_path/control/``: requests in, answers and status out.

``aprof capture`` writes ``requests/<id>.json`` atomically (a dot-file renamed into place); the
run reads the folder at each step boundary (:meth:`ControlFolder.take`) and writes
``answers/<id>.json``; ``status.json`` is the run as ``aprof status`` shows it.

Whatever lies in ``requests/``, a read is bounded and a request is not kept waiting behind it:
one read lists ``LISTED_PER_BOUNDARY`` entries at most (their types come with the names),
going on where the last read stopped; it reads regular ``<id>.json`` files first (at most
``TAKEN_PER_BOUNDARY``, 64 KiB each, no link followed, each removed once read), then answers
``<id>.json`` entries that are no regular file, and moves at most ``SET_ASIDE_PER_BOUNDARY``
entries it cannot use to ``control/rejected/`` (a bad name, a dot-file still there ``WRITE_S``
after it was first seen, a folder answered as a request): renamed, nothing of anyone's is
deleted. What can be neither removed nor moved is remembered (as many as one read lists) and
not tried again.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Generic, Literal, TypeVar

from aprof._control.messages import (
    MAX_REQUEST_BYTES,
    REQUEST_ID,
    CaptureAnswer,
    CaptureRequest,
    bad_field,
)
from aprof._control.status import RunStatus
from aprof._errors import ConfigError
from aprof._safe_files import open_folder, read_regular, replace_file

FOLDER: Final = "control"
REQUESTS: Final = "requests"
ANSWERS: Final = "answers"
REJECTED: Final = "rejected"
STATUS: Final = "status.json"
TAKEN_PER_BOUNDARY: Final = 8
"""Requests answered at one step boundary (regular files first); more wait for the next."""
LISTED_PER_BOUNDARY: Final = 8192
"""Names one read lists: a request among this many entries is found at the first read."""
SET_ASIDE_PER_BOUNDARY: Final = 256
"""Entries one read moves to ``control/rejected/``; a flooded folder drains over reads."""
WRITE_S: Final = 60.0
"""A dot-file (a write under way) still there this long after it was first seen is set aside."""
MAX_ANSWER_BYTES: Final = 1 << 20
MAX_STATUS_BYTES: Final = 4 << 20

_V = TypeVar("_V")
_Kind = Literal["file", "dir", "link", "other"]
_Key = tuple[str, int, _Kind]
"""An entry: its name, inode and kind (a name used again by a new entry is a new entry)."""
_SHOWN = re.compile(r"[^A-Za-z0-9_.-]")
NOT_WRITTEN: Final = f"a dot-file (a write under way) still there after {WRITE_S:g} s"
MISNAMED: Final = "not named <id>.json, an id being 1-64 of [A-Za-z0-9_.-] not starting with '.'"
_KINDS: Final = {
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link, which aprof does not follow",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass(frozen=True, slots=True)
class Incoming:
    """One request entry read from the folder: its request, or why it could not be read."""

    id: str
    """The id it is answered under (its file name's stem, path-safe by the name's rule)."""
    request: CaptureRequest | None
    error: str | None


@dataclass(frozen=True, slots=True)
class FolderRead:
    """What one read of ``control/requests/`` found and did."""

    incoming: list[Incoming] = field(default_factory=list)
    """Requests to decide, and request entries to refuse."""
    set_aside: list[str] = field(default_factory=list)
    """``name: why`` of each entry moved to ``control/rejected/``."""
    stuck: list[str] = field(default_factory=list)
    """``name: why`` of each entry found that could be neither removed nor moved (each is
    remembered, and told once)."""


class ControlFolder:
    """``save_path/control/`` of one run, seen by the run and by the command line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        """The run's ``save_path``."""
        self._scan: _Scan | None = None
        """The listing of ``requests/`` under way, where a read stopped."""
        self._stuck = _Memory[bool]()
        """Entries that could be neither removed nor moved."""
        self._seen = _Memory[float]()
        """Dot-files, with when they were first seen (monotonic)."""

    # -- the run's side --------------------------------------------------------------------

    def take(self) -> FolderRead:
        """Read a bounded part of ``requests/``: the requests to answer, and what was set
        aside; raises ``OSError`` when the folder cannot be made or listed (a link in its
        place included). One reader at a time (the run's disk thread)."""
        folder = open_folder(str(self.root), (FOLDER, REQUESTS), create=True)
        with _Clearing(self.root, folder) as clearing:
            listed, ended = self._list(folder)
            fresh = listed if not self._stuck else self._not_stuck(listed)
            requests = [e for e in fresh if _request_id(e.name) is not None]
            # Regular files first: a request is not kept waiting behind links, FIFOs, folders.
            requests.sort(key=lambda e: _kind(e) != "file")
            incoming = []
            for entry in requests[:TAKEN_PER_BOUNDARY]:
                taken = _take_one(folder, entry)
                incoming.append(taken)
                # Read once: answered now and never again; a folder is moved, not emptied.
                clearing.clear(entry, taken.error or "read", remove=_kind(entry) != "dir")
            misnamed = [e for e in fresh if e.name[:1] != "." and _request_id(e.name) is None]
            left = self._left_behind(fresh)
            for entry in (misnamed + left)[:SET_ASIDE_PER_BOUNDARY]:
                why = NOT_WRITTEN if entry.name.startswith(".") else MISNAMED
                clearing.clear(entry, why, remove=False)
            for key in clearing.stuck_keys:
                self._stuck.keep(key, True)
            if ended:  # the listing went round: what is remembered is what it found
                self.close()
                self._stuck.went_round()
                self._seen.went_round()
        return FolderRead(incoming, clearing.set_aside, clearing.stuck)

    def _not_stuck(self, listed: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
        """The entries not known to be stuck; those that are, remembered another round."""
        fresh = []
        for entry in listed:
            key = _key(entry)
            if self._stuck.get(key):
                self._stuck.keep(key, True)
            else:
                fresh.append(entry)
        return fresh

    def _left_behind(self, listed: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
        """The dot-files first seen ``WRITE_S`` ago or more, at an earlier read: writes no
        longer under way."""
        now = time.monotonic()
        left = []
        for entry in listed:
            if entry.name[:1] != ".":
                continue
            key = _key(entry)
            first = self._seen.get(key)
            if first is not None and now - first >= WRITE_S:
                left.append(entry)
            self._seen.keep(key, now if first is None else first)
        return left

    def _list(self, folder: int) -> tuple[list[os.DirEntry[str]], bool]:
        """The next ``LISTED_PER_BOUNDARY`` entries of ``folder`` at most, going on where
        the last read stopped (from the start once all were listed, or when ``folder`` is
        another folder than the one listed), and whether they were the last. The listing
        stays open while its entries are used: their stat calls go through it."""
        scan = self._scan
        if scan is not None and scan.identity != _identity(folder):
            self.close()
            scan = None
        went_on = scan is not None
        try:
            if scan is None:
                scan = self._scan = _Scan(folder)
            listed = list(itertools.islice(scan.entries, LISTED_PER_BOUNDARY))
            if not listed and went_on:  # the last read listed the very last entries
                self.close()
                scan = self._scan = _Scan(folder)
                listed = list(itertools.islice(scan.entries, LISTED_PER_BOUNDARY))
        except BaseException:
            self.close()  # a listing that failed is not gone on with
            raise
        return listed, len(listed) < LISTED_PER_BOUNDARY

    def close(self) -> None:
        """Let go of the listing under way (the next read starts a new one)."""
        scan, self._scan = self._scan, None
        if scan is not None:
            scan.close()

    @staticmethod
    def answer_key(answer: CaptureAnswer) -> tuple[str, ...]:
        """Where ``answer`` is written, as names below ``save_path``."""
        return (FOLDER, ANSWERS, f"{answer.id}.json")

    @staticmethod
    def status_key() -> tuple[str, ...]:
        """Where the run's status is written, as names below ``save_path``."""
        return (FOLDER, STATUS)

    # -- the command line's side ---------------------------------------------------------------

    def submit(self, request: CaptureRequest) -> None:
        """Write ``request`` where the run reads it, atomically: the run never sees half of it."""
        data = request.model_dump_json(by_alias=True, exclude_none=True).encode()
        folder = open_folder(str(self.root), (FOLDER, REQUESTS), create=True)
        try:
            replace_file(folder, f"{request.id}.json", (data,))
        finally:
            os.close(folder)

    def withdraw(self, request_id: str) -> bool:
        """Remove request ``request_id`` if the run has not read it yet; True if it was there."""
        try:
            folder = open_folder(str(self.root), (FOLDER, REQUESTS), create=False)
        except FileNotFoundError:
            return False
        try:
            os.unlink(f"{request_id}.json", dir_fd=folder)
        except FileNotFoundError:
            return False
        finally:
            os.close(folder)
        return True

    def answer(self, request_id: str) -> CaptureAnswer | None:
        """The run's answer to ``request_id``, ``None`` while there is none."""
        data = self._read((FOLDER, ANSWERS), f"{request_id}.json", MAX_ANSWER_BYTES)
        return None if data is None else CaptureAnswer.model_validate_json(data)

    def status(self) -> RunStatus | None:
        """The run's last written status, ``None`` if it wrote none (``ValueError`` if it
        cannot be read)."""
        data = self._read((FOLDER,), STATUS, MAX_STATUS_BYTES)
        return None if data is None else RunStatus.model_validate_json(data)

    def _read(self, parts: tuple[str, ...], name: str, limit: int) -> bytes | None:
        try:
            folder = open_folder(str(self.root), parts, create=False)
        except FileNotFoundError:
            return None
        try:
            return read_regular(name, limit, dir_fd=folder)
        except FileNotFoundError:
            return None
        finally:
            os.close(folder)


class _Scan:
    """A listing of ``requests/`` read a part at a time: entries that stay are listed once,
    entries made meanwhile maybe (the next listing has them)."""

    def __init__(self, folder: int) -> None:
        self._fd = os.dup(folder)  # the entries' own stat calls use it: held with them
        try:
            self.identity = _identity(self._fd)
            self.entries = os.scandir(self._fd)
        except BaseException:
            os.close(self._fd)
            raise

    def close(self) -> None:
        self.entries.close()
        os.close(self._fd)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


class _Memory(Generic[_V]):
    """Something known of entries, as of the last full round of the listing and the round
    under way; at most ``LISTED_PER_BOUNDARY`` entries of each (beyond, nothing is kept)."""

    def __init__(self) -> None:
        self._last: dict[_Key, _V] = {}
        self._now: dict[_Key, _V] = {}

    def __bool__(self) -> bool:
        return bool(self._last or self._now)

    def get(self, key: _Key) -> _V | None:
        return self._now.get(key, self._last.get(key))

    def keep(self, key: _Key, value: _V) -> None:
        """Know ``value`` of ``key`` through the next round."""
        if key in self._now or len(self._now) < LISTED_PER_BOUNDARY:
            self._now[key] = value

    def went_round(self) -> None:
        """The listing went round: what was not seen again is gone."""
        self._last, self._now = self._now, {}


def _key(entry: os.DirEntry[str]) -> _Key:
    return entry.name, entry.inode(), _kind(entry)


def _kind(entry: os.DirEntry[str]) -> _Kind:
    try:
        if entry.is_symlink():
            return "link"
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        return "file" if entry.is_file(follow_symlinks=False) else "other"
    except OSError:  # gone meanwhile, where the type needed a stat: told when it is taken
        return "other"


def _request_id(name: str) -> str | None:
    """The id of a request entry named ``<id>.json``; ``None`` for any other name."""
    stem = name.removesuffix(".json")
    return stem if stem != name and REQUEST_ID.fullmatch(stem) else None


def _take_one(folder: int, entry: os.DirEntry[str]) -> Incoming:
    """The request in entry ``entry`` (named ``<id>.json``), or why there is none; only a
    regular file is opened."""
    request_id = entry.name.removesuffix(".json")
    if _kind(entry) == "file":
        request, error = _read_request(folder, entry.name, request_id)
        return Incoming(request_id, request, error)
    try:
        mode = os.stat(entry.name, dir_fd=folder, follow_symlinks=False).st_mode
    except OSError as exc:
        return Incoming(request_id, None, f"cannot be read: {exc.strerror or exc}")
    kind = _KINDS.get(stat.S_IFMT(mode), "a file of another kind")
    return Incoming(request_id, None, f"not a regular file: {kind}")


def _read_request(folder: int, name: str, stem: str) -> tuple[CaptureRequest | None, str | None]:
    """The request in file ``name`` whose id must be ``stem``, or why there is none."""
    try:
        data = json.loads(read_regular(name, MAX_REQUEST_BYTES, dir_fd=folder))
        parsed = CaptureRequest.parse(data)
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    except ConfigError as exc:
        return None, bad_field(exc)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
        return None, "not a JSON document"
    if parsed.id != stem:
        return None, f"its id {parsed.id!r} is not its file name's"
    return parsed, None


class _Clearing:
    """Entries taken out of ``requests/`` (``folder``, closed on exit): removed, or renamed
    into ``control/rejected/`` (opened when first needed, never through a link), or else
    found stuck."""

    def __init__(self, root: Path, folder: int) -> None:
        self._root, self._folder = root, folder
        self._rejected: int | OSError | None = None
        """``control/rejected/``, or why it cannot be opened (tried once a read)."""
        self.set_aside: list[str] = []
        self.stuck: list[str] = []
        self.stuck_keys: list[_Key] = []

    def __enter__(self) -> _Clearing:
        return self

    def __exit__(self, *exc: object) -> None:
        if isinstance(self._rejected, int):
            os.close(self._rejected)
        os.close(self._folder)

    def clear(self, entry: os.DirEntry[str], why: str, *, remove: bool) -> None:
        """Remove ``entry`` (with ``remove``) or else move it to ``control/rejected/`` under
        a fresh name; failing both, it is stuck."""
        if remove:
            try:
                os.unlink(entry.name, dir_fd=self._folder)
                return
            except FileNotFoundError:
                return
            except OSError:
                pass  # a folder swapped in, or no right to remove: moved if it can be
        shown = f"{_show(entry.name)} ({_kind(entry)})"
        try:
            aside = f"{secrets.token_hex(8)}-{_SHOWN.sub('_', entry.name)[:64]}"
            os.rename(entry.name, aside, src_dir_fd=self._folder, dst_dir_fd=self._aside())
        except FileNotFoundError:
            return  # gone meanwhile (its writer removed it, or renamed it into place)
        except OSError as exc:
            self.stuck.append(f"{shown}: {why}; cannot be moved: {exc.strerror or exc}")
            self.stuck_keys.append(_key(entry))
        else:
            self.set_aside.append(f"{shown}: {why}")

    def _aside(self) -> int:
        """``control/rejected/``; raises the ``OSError`` that kept it from being opened."""
        if self._rejected is None:
            try:
                self._rejected = open_folder(str(self._root), (FOLDER, REJECTED), create=True)
            except OSError as exc:
                self._rejected = exc
        if isinstance(self._rejected, OSError):
            raise self._rejected.with_traceback(None)
        return self._rejected


def _show(name: str) -> str:
    """A file name as one line of a log, bounded."""
    shown = repr(name)
    return shown if len(shown) <= 80 else shown[:77] + "..."
