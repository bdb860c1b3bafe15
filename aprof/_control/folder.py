"""The control folder of a run, ``save_path/control/``: requests in, answers and status out.

``aprof capture`` writes ``requests/<id>.json`` atomically; the run reads a few requests at each
step boundary (:meth:`ControlFolder.take`: a bounded directory read, bounded files, no link
followed), removes each one it read, and writes ``answers/<id>.json``; ``status.json`` is the
run as ``aprof status`` shows it. A request that cannot be read (garbage, too large, a link, a
FIFO, a bad name) is answered with why, and changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aprof._control.messages import (
    MAX_REQUEST_BYTES,
    REQUEST_ID,
    CaptureAnswer,
    CaptureRequest,
    bad_field,
)
from aprof._control.status import RunStatus
from aprof._errors import ConfigError
from aprof._layout import safe_name
from aprof._safe_files import open_folder, read_regular, replace_file

FOLDER: Final = "control"
REQUESTS: Final = "requests"
ANSWERS: Final = "answers"
STATUS: Final = "status.json"
TAKEN_PER_BOUNDARY: Final = 8
"""Requests read at one step boundary; more wait for the next ones."""
LOOKED_AT_PER_BOUNDARY: Final = 64
"""Folder entries looked at per boundary: a folder flooded with files costs the same."""
MAX_ANSWER_BYTES: Final = 1 << 20
MAX_STATUS_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class Incoming:
    """One request file read from the folder: its request, or why it could not be read."""

    id: str
    """The id it is answered under (its file name's stem, made path-safe)."""
    request: CaptureRequest | None
    error: str | None


class ControlFolder:
    """``save_path/control/`` of one run, seen by the run and by the command line."""

    def __init__(self, root: Path) -> None:
        self.root = root
        """The run's ``save_path``."""

    # -- the run's side --------------------------------------------------------------------

    def take(self) -> list[Incoming]:
        """Read and remove up to ``TAKEN_PER_BOUNDARY`` request files; raises ``OSError`` when
        the folder cannot be made or read (a link in its place included)."""
        folder = open_folder(str(self.root), (FOLDER, REQUESTS), create=True)
        taken: list[Incoming] = []
        try:
            with os.scandir(folder) as entries:
                for looked, entry in enumerate(entries, 1):
                    if not entry.name.startswith("."):  # dot files: writes still under way
                        taken.append(_take_one(folder, entry.name))
                    if len(taken) >= TAKEN_PER_BOUNDARY or looked >= LOOKED_AT_PER_BOUNDARY:
                        break
        finally:
            os.close(folder)
        return taken

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


def _take_one(folder: int, name: str) -> Incoming:
    """Read request file ``name`` and remove it, whatever it holds."""
    stem = name[:-5] if name.endswith(".json") else name
    named = name.endswith(".json") and REQUEST_ID.fullmatch(stem) is not None
    request: CaptureRequest | None = None
    error: str | None = "the file name is not <id>.json with an id of 1-64 of [A-Za-z0-9_.-]"
    try:
        if named:
            request, error = _read_request(folder, name, stem)
    finally:
        # Read once: whatever it held is answered now and never again.
        with contextlib.suppress(OSError):
            _remove(folder, name)
    request_id = stem if named else safe_name(stem)[:64].lstrip(".") or "x"
    return Incoming(request_id, request, error)


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


def _remove(folder: int, name: str) -> None:
    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        os.rmdir(name, dir_fd=folder)  # an empty folder only: nothing of anyone's is lost
    else:
        os.unlink(name, dir_fd=folder)
