"""The timeline writers' ledgers read back: what each process's timeline holds, accounted
already (``timeline/<process>.ledger.jsonl``, one JSON line per write, beside its parts), so
that neither the accounting of every step nor the report need parse the timelines' JSON but
for the writes that hold a profiled step: each line says where in its part the write's
events lie, compressed on their own (:func:`read_writes`).

A process's ledgers are used only when they cover what the manifest lists of its timeline:
one of their lines names the part and event count of the process's last listed part (the
lines up to it are used, each checked whole). Otherwise (no file, a failed append, a file
replaced or damaged, an older run) the report reads that process's timelines themselves.
Read below ``save_path`` following no link, a line at a time: what the reading holds is a
line (at most ``LINE_BYTES``) and the ledgers taken, never the file.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import PurePosixPath
from typing import BinaryIO, NamedTuple

from aprof._accounting import Ledger, ledger_file
from aprof._errors import describe
from aprof._manifest import Manifest, TimelineFile
from aprof._safe_files import open_folder, open_regular

LINE_BYTES = 256 << 20
"""The longest ledger line read (one write's; a write of 100,000 requests is some 3 MB)."""
_HEAD = re.compile(
    rb'\{"part":([0-9]{1,8}),"events":([0-9]{1,18}),"at":\[([0-9]{1,15}),([0-9]{1,15})\],'
    rb'"base":(-?[0-9]{1,20}),"ledger":'
)
"""How every line the writer appends begins (``ChromeTraceWriter._keep_ledger``)."""


class Writes(NamedTuple):
    """Writes of one timeline part: where their compressed events lie, on which clock."""

    path: str
    """The part, as the manifest lists it."""
    base_ns: int
    """Their ``baseTimeNanoseconds``."""
    at: list[tuple[int, int]]
    """Offset and length of each write's compressed events, in file order."""


class Taken(NamedTuple):
    """What :func:`take_ledgers` took."""

    processes: set[str]
    """The processes whose ledgers were taken: their timelines are accounted already."""
    accounted: set[str]
    """Their timeline files (``TimelineFile.path``): the report reads only ``writes`` of
    them."""
    writes: list[Writes]
    """The writes holding a profiled step, per part."""
    notes: list[str]
    """One per process whose ledgers were there but not used (its timelines are read)."""


def take_ledgers(root: str, manifest: Manifest, ledger: Ledger, profiled: set[int]) -> Taken:
    """Merge into ``ledger`` the ledgers of each process whose file covers its listed
    timeline; say where the writes holding a step of ``profiled`` lie in their parts."""
    mine: dict[str, list[TimelineFile]] = {}
    for entry in manifest.timeline:
        mine.setdefault(entry.process, []).append(entry)
    taken = Taken(set(), set(), [], [])
    for process, entries in sorted(mine.items()):
        last = max(entries, key=part_of)
        folder = PurePosixPath(last.path).parent
        name = folder / ledger_file(process)
        try:
            found = _take(root, folder.parts, ledger_file(process), last, profiled)
        except FileNotFoundError:
            continue
        except Exception as exc:  # a link, a FIFO, a damaged line: the timelines say it all
            taken.notes.append(f"{name}: not used ({describe(exc)})")
            continue
        if found is None:
            taken.notes.append(f"{name}: not used (it does not cover the listed timeline)")
            continue
        process_ledger, needed = found
        ledger.absorb(process_ledger)
        taken.processes.add(process)
        taken.accounted.update(e.path for e in entries)
        paths = {part_of(e): e.path for e in entries}
        for (part, base), at in sorted(needed.items()):
            if part in paths:
                taken.writes.append(Writes(paths[part], base, at))
    return taken


def part_of(entry: TimelineFile) -> int:
    """The part number of a timeline file: ``<process>.<k>.trace.json.gz`` is part ``k``."""
    stem = PurePosixPath(entry.path).name.removesuffix(".trace.json.gz")
    head, _, tail = stem.rpartition(".")
    if head == entry.process and tail.isdigit() and len(tail) < 9:
        return int(tail)
    return 1


def _take(
    root: str, folders: tuple[str, ...], name: str, last: TimelineFile, profiled: set[int]
) -> tuple[Ledger, dict[tuple[int, int], list[tuple[int, int]]]] | None:
    """The ledger of the file's lines up to the one naming ``last``'s part and event count,
    with where the writes holding a step of ``profiled`` lie, per part and clock; ``None``
    when no complete line names them (a line cut short by a killed run ends the file
    there). Raises on a line that is no ledger."""
    folder = open_folder(root, folders, create=False)
    try:
        file = open_regular(name, dir_fd=folder)
    finally:
        os.close(folder)
    with file:
        # First the lines' heads alone: the lines are taken only when one covers the listing.
        count = _covering(file, part_of(last), last.events)
        if count is None:
            return None
        file.seek(0)
        taken = Ledger()
        needed: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for _ in range(count):
            line = _line(file)
            head = _HEAD.match(line)
            if head is None:
                raise ValueError("the file changed while it was read")
            one = Ledger()
            one.merge(json.loads(line)["ledger"])
            if not profiled.isdisjoint(one.steps_held()):
                where = (int(head[1]), int(head[5]))
                needed.setdefault(where, []).append((int(head[3]), int(head[4])))
            taken.absorb(one)
    return taken, needed


def _covering(file: BinaryIO, part: int, events: int) -> int | None:
    """How many lines of ``file`` lead up to the first naming ``part`` and ``events``."""
    count = 0
    while True:
        line = _line(file)
        head = _HEAD.match(line)
        if head is None or not line.endswith(b"\n"):
            return None  # not a ledger line, or the end: nothing names the listing
        count += 1
        if (int(head[1]), int(head[2])) == (part, events):
            return count


def _line(file: BinaryIO) -> bytes:
    line = file.readline(LINE_BYTES + 1)
    if len(line) > LINE_BYTES:
        raise ValueError(f"a line longer than {LINE_BYTES} bytes")
    return line


def read_writes(root: str, writes: Writes, limit: int) -> dict[str, object]:
    """The events of ``writes`` as a trace (``baseTimeNanoseconds``, ``traceEvents``), read
    below ``root`` following no link, at most ``limit`` bytes of JSON. Raises when they are
    not where their ledgers say (the part replaced, cut short, damaged)."""
    path = PurePosixPath(writes.path)
    folder = open_folder(root, path.parent.parts, create=False)
    try:
        file = open_regular(path.name, dir_fd=folder)
    finally:
        os.close(folder)
    events: list[object] = []
    left = limit
    with file:
        size = os.fstat(file.fileno()).st_size
        for offset, length in _runs(writes.at):
            if offset + length > size:  # never ask for more than the file holds
                raise ValueError(f"writes at {offset} end past the part's end")
            file.seek(offset)
            data = file.read(length)
            # A write's events follow a full flush: raw deflate, but for the part's first.
            inflate = zlib.decompressobj(31 if offset == 0 else -zlib.MAX_WBITS)
            try:
                text = inflate.decompress(data, left + 1)
            except zlib.error as exc:
                raise ValueError(f"writes at {offset} not as their ledgers say: {exc}") from None
            if len(data) < length or inflate.unconsumed_tail or len(text) > left:
                raise ValueError(f"writes at {offset} not as their ledgers say")
            left -= len(text)
            if offset == 0:  # the trace's head, then its events
                text = text[text.index(b'"traceEvents":[') + len(b'"traceEvents":[') :]
            found = json.loads(b"[" + text.strip().lstrip(b",") + b"]")
            events.extend(found)
    return {"baseTimeNanoseconds": writes.base_ns, "traceEvents": events}


def _runs(at: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Writes that follow one another in the file, as one: their events decompress on."""
    runs: list[tuple[int, int]] = []
    for offset, length in at:
        if runs and sum(runs[-1]) == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + length)
        else:
            runs.append((offset, length))
    return runs
