"""The files the run's receiver writes below ``save_path/otel/``, their names, and the one
reader of a step's spans (the merge and the report both read through it)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aprof._safe_files import open_folder, read_regular

FOLDER: Final = "otel"
NO_STEP_FILE: Final = "no_step.spans.jsonl"
"""This run's spans given outside any step."""
OTHER_FILE: Final = "other.spans.jsonl"
"""Spans of another trace: requests sent without this run's trace context."""
MAX_FILE_BYTES: Final = 256 << 20
"""A step's spans file read at most (the receiver keeps ``otel.max_spans_per_step`` lines,
about 1 KiB each from vLLM and SGLang)."""


def step_file(step: int) -> str:
    """The name of the file holding the spans of ``step``."""
    return f"step_{step}.spans.jsonl"


def step_in(name: str) -> int:
    """The step of a :func:`step_file` name (-1 for the other files)."""
    head = name.partition(".")[0]
    return int(head[5:]) if head.startswith("step_") and head[5:].isdigit() else -1


@dataclass(frozen=True)
class StepSpans:
    """The spans the receiver filed for one step, as it wrote them (one object per line)."""

    shown: str
    """The file, as notes name it (``otel/step_<n>.spans.jsonl``)."""
    spans: list[dict[str, Any]]
    bad: int
    """Lines that were not a JSON object."""


@contextmanager
def otel_folder(root: str | os.PathLike[str]) -> Iterator[int | None]:
    """A descriptor of the run's ``otel/`` folder while the block runs (``None`` when the run
    has none); raises ``OSError`` when it cannot be opened (a link there included)."""
    try:
        folder = open_folder(str(Path(root)), (FOLDER,), create=False)
    except FileNotFoundError:
        yield None
        return
    try:
        yield folder
    finally:
        os.close(folder)


def read_step(folder: int, step: int) -> StepSpans | None:
    """The spans of ``step`` in the ``otel/`` folder open as ``folder`` (no link followed),
    ``None`` when there are none; raises ``OSError`` for a file that cannot be read (or is
    over ``MAX_FILE_BYTES``)."""
    name = step_file(step)
    try:
        data = read_regular(name, MAX_FILE_BYTES, dir_fd=folder)
    except FileNotFoundError:
        return None
    spans, bad = [], 0
    for line in data.splitlines():
        try:
            span = json.loads(line)
        except ValueError:
            span = None
        if isinstance(span, dict):
            spans.append(span)
        else:
            bad += 1
    return StepSpans(f"{FOLDER}/{name}", spans, bad)
