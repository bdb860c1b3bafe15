"""The timeline writers' ledgers read back: what each process's timeline holds, accounted
already (``timeline/<process>.ledger.jsonl``, one JSON line per write, beside its parts), so
that the accounting of every step need not parse the timelines' JSON.

A process's ledgers are used only when they cover what the manifest lists of its timeline:
one of their lines names the part and event count of the process's last listed part (the
lines up to it are used). Otherwise (no file, a failed append, a file replaced or damaged, an
older run) the report reads that process's timelines themselves. Read below ``save_path``
following no link, at most ``MAX_INPUT_BYTES``.
"""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath
from typing import Any

from aprof._accounting import Ledger, ledger_file
from aprof._errors import describe
from aprof._manifest import Manifest, TimelineFile
from aprof._report.traces import MAX_INPUT_BYTES
from aprof._safe_files import open_folder, read_regular


def take_ledgers(root: str, manifest: Manifest, ledger: Ledger) -> tuple[set[str], list[str]]:
    """Merge into ``ledger`` the ledgers of each process whose file covers its listed
    timeline; returns those processes, and one note per process whose file was there but not
    used (the report reads its timelines instead)."""
    last: dict[str, TimelineFile] = {}
    for entry in manifest.timeline:
        held = last.get(entry.process)
        if held is None or _part(entry) >= _part(held):
            last[entry.process] = entry
    covered: set[str] = set()
    notes: list[str] = []
    for process, entry in sorted(last.items()):
        folder = PurePosixPath(entry.path).parent
        name = ledger_file(process)
        try:
            lines = _read(root, folder.parts, name)
        except FileNotFoundError:
            continue
        except Exception as exc:  # a link, a FIFO, too large: the timelines say it all
            notes.append(f"{folder / name}: not used ({describe(exc)})")
            continue
        plains = _covering(lines, _part(entry), entry.events)
        if plains is None:
            notes.append(f"{folder / name}: not used (it does not cover the listed timeline)")
            continue
        try:
            for plain in plains:
                ledger.merge(plain)
        except Exception as exc:  # not a ledger: merge checks it whole before it takes it
            notes.append(f"{folder / name}: not used ({describe(exc)})")
            continue
        covered.add(process)
    return covered, notes


def _part(entry: TimelineFile) -> int:
    """The part number of a timeline file: ``<process>.<k>.trace.json.gz`` is part ``k``."""
    stem = PurePosixPath(entry.path).name.removesuffix(".trace.json.gz")
    head, _, tail = stem.rpartition(".")
    if head == entry.process and tail.isdigit() and len(tail) < 9:
        return int(tail)
    return 1


def _read(root: str, folders: tuple[str, ...], name: str) -> list[str]:
    folder = open_folder(root, folders, create=False)
    try:
        data = read_regular(name, MAX_INPUT_BYTES, dir_fd=folder)
    finally:
        os.close(folder)
    return data.decode("ascii", errors="replace").split("\n")


def _covering(lines: list[str], part: int, events: int) -> list[Any] | None:
    """The ledgers of ``lines`` up to the one naming ``part`` and ``events``; ``None`` when
    no complete line does (a line cut short by a killed run ends the file here)."""
    plains: list[Any] = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        if not isinstance(record, dict):
            return None
        plains.append(record.get("ledger"))
        if record.get("part") == part and record.get("events") == events:
            return plains
    return None
