"""Reading a run's manifest back: ``manifest.json`` and its step files, bounded, as one
:class:`Manifest`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from aprof._errors import ManifestError
from aprof._manifest.model import (
    FILENAME,
    MOST_BYTES,
    SCHEMA,
    SINGLE_FILE_SCHEMA,
    STEP_FILE,
    STEP_SCHEMA,
    STEPS_FOLDER,
    Manifest,
    RunFile,
    StepFile,
    WindowRecord,
)
from aprof._safe_files import read_regular


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a run's manifest back from its ``save_path`` folder (or its ``manifest.json``),
    with the windows and notes of every step file of that run.

    Raises ``ManifestError`` naming the file and what is wrong with it.
    """
    file = Path(path)
    if file.is_dir():
        file = file / FILENAME
    data = _read(file, SCHEMA, SINGLE_FILE_SCHEMA)
    if data["schema"] == SINGLE_FILE_SCHEMA:
        return _validate(Manifest, {**data, "schema": SCHEMA}, file)
    run = _validate(RunFile, data, file)
    windows: list[WindowRecord] = []
    notes = list(run.notes)
    for step_file in _step_files(file.parent / STEPS_FOLDER):
        step = _validate(StepFile, _read(step_file, STEP_SCHEMA), step_file)
        if step.run_id == run.run_id:  # others are what an earlier run in this folder left
            windows += step.windows
            notes += step.notes
    return Manifest(
        run_id=run.run_id,
        clock=run.clock,
        save_path=run.save_path,
        windows=windows,
        notes=notes,
        timeline=run.timeline,
        trace_salt=run.trace_salt,
        otel=run.otel,
        hosts=run.hosts,
        files=run.files,
        config=run.config,
    )


def load_run_file(path: str | os.PathLike[str]) -> RunFile:
    """The run file (``manifest.json``) of the run at ``save_path`` ``path``, alone; raises
    ``ManifestError`` as :func:`load_manifest` does."""
    file = Path(path) / FILENAME
    return _validate(RunFile, _read(file, SCHEMA), file)


def load_step(path: str | os.PathLike[str], step: int, run_id: str) -> list[WindowRecord]:
    """The windows of ``step`` of run ``run_id`` below ``save_path`` ``path`` (none while its
    step file is not written, or holds another run's); ``ManifestError`` if it is unreadable."""
    file = Path(path) / STEPS_FOLDER / f"step_{step}.json"
    try:
        data = _read(file, STEP_SCHEMA)
    except ManifestError:
        if not os.path.lexists(file):
            return []
        # It may have been renamed into place (whole) between the read and the look: once
        # there it stays there, so a second read tells a file just written from a bad one.
        data = _read(file, STEP_SCHEMA)
    found = _validate(StepFile, data, file)
    return found.windows if found.run_id == run_id else []


def _step_files(folder: Path) -> list[Path]:
    """Every ``step_<n>.json`` in ``folder``, by step."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                match = STEP_FILE.fullmatch(entry.name)
                if match and entry.is_file(follow_symlinks=False):
                    found.append((int(match[1]), Path(entry.path)))
    except FileNotFoundError:
        return []  # a run without profiled steps
    except OSError as exc:
        raise ManifestError(f"{folder}: cannot list: {exc.strerror or exc}") from None
    return [file for _, file in sorted(found)]


def _read(file: Path, *schemas: str) -> dict[str, Any]:
    """The JSON object of ``file``, whose ``schema`` is one of ``schemas``."""
    try:
        raw = read_regular(file, MOST_BYTES)  # never a FIFO's wait or a device's flood
    except OSError as exc:
        raise ManifestError(f"{file}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the name
        raise ManifestError(f"{file}: cannot read: {exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON or UTF-8
        raise ManifestError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") not in schemas:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ManifestError(f"{file}: expected schema {schemas[0]!r}, found {found!r}")
    return data


_M = TypeVar("_M", bound=BaseModel)


def _validate(model: type[_M], data: dict[str, Any], file: Path) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ManifestError(f"{file}: {where}: {first['msg']}") from None
