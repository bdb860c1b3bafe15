"""Spans a user's own OpenTelemetry collector wrote: its file exporter's OTLP JSON, one export
per line, in the files of one folder, read back by the step their trace ids name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aprof._otel.spans import JSON, BodyError, decode, require, step_of
from aprof._safe_files import read_regular
from aprof._traces.files import unreadable

MAX_FILE_BYTES: Final = 2 << 30
"""A collector's file read at most."""
MAX_SPANS_PER_STEP: Final = 1_000_000
"""Spans of one step kept at most; the others are counted in a note."""


@dataclass
class Collected:
    """The spans of the chosen steps a collector's files held, and what to say of them."""

    by_step: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def collected_spans(folder: Path, salt: str | None, steps: set[int]) -> Collected:
    """The spans of ``steps`` of the run whose trace ids begin with ``salt``, from every
    regular file in ``folder`` (no link followed, names in order); a note for each file or
    line that is not OTLP JSON, and for spans past the per-step cap."""
    found = Collected()
    try:
        require()
    except ImportError as exc:
        found.notes.append(f"{folder}: not read: {exc}")
        return found
    if salt is None:
        found.notes.append(f"{folder}: not read: this run gave its requests no trace context")
        return found
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        found.notes.append(f"{folder}: not read: {unreadable(exc)}")
        return found
    dropped = 0
    for name in names:
        try:
            data = read_regular(folder / name, MAX_FILE_BYTES)
        except OSError as exc:
            found.notes.append(f"{folder / name}: not read: {unreadable(exc)}")
            continue
        bad = 0
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                spans = decode(line, JSON, MAX_SPANS_PER_STEP)
            except BodyError:
                bad += 1
                continue
            for span in spans:
                step = step_of(span["trace_id"], salt)
                if step is None or step not in steps:
                    continue
                kept = found.by_step.setdefault(step, [])
                if len(kept) < MAX_SPANS_PER_STEP:
                    kept.append(span)
                else:
                    dropped += 1
        if bad:
            found.notes.append(f"{folder / name}: {bad} line(s) not an OTLP JSON export")
    if dropped:
        found.notes.append(
            f"{folder}: {dropped} span(s) past {MAX_SPANS_PER_STEP} of a step not read"
        )
    return found
