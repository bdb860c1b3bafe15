"""One step, one trace: a profiled step's timelines and captures merged onto one clock.

Every input is Chrome trace JSON, each with its own clock:

- aprof's timelines (``timeline/*.trace.json.gz``): ``baseTimeNanoseconds`` (wall clock, from
  the process's anchor) plus ``ts`` in µs; only the step's events are taken (those whose
  ``args.step`` is the step, and the ends of the spans they begin);
- torch.profiler (Kineto) traces, of servers' workers and trainer ranks: ``baseTimeNanoseconds``
  plus ``ts`` in µs;
- traces without ``baseTimeNanoseconds`` whose ``ts`` are absolute µs since the epoch (vLLM's
  frontend trace): placed as they are.

All are placed by wall clock, so files from other hosts line up as far as their clocks agree.
Each input's processes get pids of their own in the merged file, named for the target first
(``replica_0 · vLLM worker``, ``actor · rank 0``, ``driver``). An input that is missing,
unreadable, on no known clock or without one event that can be placed (a timeline: none of
the step) is left out and named in a note, with why; one cut short is merged up to the cut,
with a note; the rest is merged: every input is either merged or named. Each input is read
event by event (``placing.py``), a step's captures by worker processes where it pays
(``parallel.py``); the merged file is written as it goes, into the merge's own folder
(``scratch.py``), then renamed into place. Where a replica's trace
names the requests of its forward steps, flow arrows link each request span to them
(``flows.py``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from aprof._config import StepSelection
from aprof._manifest import Manifest, WindowRecord, load_manifest
from aprof._merge import parallel
from aprof._merge.archive import ArchiveFile
from aprof._merge.archive import write as write_archive
from aprof._merge.flows import Links
from aprof._merge.gzip_stream import Deflated, gzip_stream
from aprof._merge.placing import FLOWS_PER_INPUT, Input, Placed, Scope, place, texts
from aprof._merge.scratch import Scratch
from aprof._otel import FOLDER as OTEL_FOLDER
from aprof._otel import Collected, collected_spans, otel_folder, read_step, step_file
from aprof._safe_files import open_folder
from aprof._traces.files import (
    is_trace_json,
    unreadable,
    without_merged_copy,
)

FOLDER = "merged"
"""Where the merged traces go, below ``save_path`` unless told otherwise."""


@dataclass(frozen=True)
class MergedStep:
    """One merged step: where it was written and what went into it."""

    step: int
    path: Path
    events: int
    inputs: tuple[str, ...]
    """The files merged, relative to ``save_path``."""
    notes: tuple[str, ...]
    """What could not be merged, and why."""
    others: tuple[str, ...] = ()
    """The step's files that are not Chrome JSON traces (tables, nsys reports), as they are."""
    archive: Path | None = None
    """The same step as a Perfetto trace archive (the merged inputs, untouched, with a
    ``perfetto_manifest.json``), when any input was merged."""


@dataclass
class _Output:
    base_ns: int
    events: int = 0
    notes: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    archived: list[ArchiveFile] = field(default_factory=list)
    """The merged inputs, as the trace archive holds them."""
    scopes: dict[int, Scope] = field(default_factory=dict)
    """Per scope (all parts of one timeline, or one file): its pids and open spans."""
    links: Links = field(default_factory=Links)
    """The step's request spans and forward steps that name them: the flow arrows."""

    def take(self, item: Input, placed: Placed) -> None:
        """What placing ``item`` gave, besides its text."""
        self.events += placed.events
        self.notes += placed.notes
        self.links.steps += placed.forward
        if placed.archived is not None:
            self.merged.append(item.path)
            self.archived.append(placed.archived)


def merge(
    save_path: str | os.PathLike[str],
    *,
    steps: StepSelection | Iterable[int] | None = None,
    out: str | os.PathLike[str] | None = None,
    otel: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    clock_offsets: bool = True,
) -> list[MergedStep]:
    """Merge each profiled step of the run in ``save_path`` (or ``steps``) into
    ``<out>/step_<n>.trace.json.gz`` (``out`` defaults to ``save_path/merged``). The servers'
    own spans of its requests come from the run's receiver (``save_path/otel/``) and from
    ``otel``, a folder of files an OpenTelemetry collector's file exporter wrote (OTLP JSON,
    one export per line). ``jobs`` processes, this one and workers, read a step's captures
    at once (default: the cores available, for steps whose captures are large enough to pay
    for a worker's start; 1: no worker), the merged file the same whatever their number.
    Each file written on another host of a Ray cluster is moved by that host's measured
    clock offset (the manifest's ``hosts``); ``clock_offsets=False`` trusts the hosts' wall
    clocks instead.

    What the merge writes is whole before it takes its name; what a merge killed on the way
    left is removed by the next one (``scratch.py``). Raises ``ManifestError`` when
    ``save_path`` holds no readable manifest, ``ValueError`` for a step the run did not
    profile and ``OSError`` when the output folder cannot be written; an input that cannot be
    merged is a note instead.
    """
    root = Path(save_path)
    manifest = load_manifest(root)
    profiled = sorted({w.step for w in manifest.windows})
    shown = ", ".join(map(str, profiled)) or "none"
    if isinstance(steps, StepSelection):
        chosen = [n for n in profiled if n in steps]
        if not chosen:
            raise ValueError(f"no step of {steps} was profiled in this run (profiled: {shown})")
    else:
        chosen = profiled if steps is None else sorted(set(steps))
        missing = [n for n in chosen if n not in profiled]
        if missing:
            raise ValueError(f"step {missing[0]} was not profiled in this run (profiled: {shown})")
    # Below save_path, no link is followed; a folder of the user's choosing is theirs.
    where = (str(root), [FOLDER]) if out is None else (os.fspath(out), [])
    collected = Collected()
    if otel is not None:
        collected = collected_spans(Path(otel), manifest.trace_salt, set(chosen))
    if jobs is not None and jobs < 1:
        raise ValueError(f"jobs must be 1 or more, got {jobs}")
    size = parallel.WORTH_BYTES if jobs is None else 0  # asked for: used whatever the size
    count = (parallel.available_cores() if jobs is None else jobs) - 1  # this one places too
    folder = open_folder(where[0], where[1], create=True)
    try:
        scratch = Scratch(folder)
        workers = None
        try:
            if count > 0 and _worth_workers(root, manifest, chosen, size):
                workers = parallel.Workers(count, scratch)
            return [
                _merge_step(root, manifest, n, where, collected, scratch, workers, clock_offsets)
                for n in chosen
            ]
        finally:
            if workers is not None:
                workers.close()  # before the folder goes: they write there
            scratch.close()
    finally:
        os.close(folder)


def _merge_step(
    root: Path,
    manifest: Manifest,
    step: int,
    where: tuple[str, list[str]],
    collected: Collected,
    scratch: Scratch,
    workers: parallel.Workers | None,
    clock_offsets: bool,
) -> MergedStep:
    output = _Output(base_ns=manifest.clock.wall_ns)
    output.notes += collected.notes
    output.links.see_otel(collected.by_step.get(step, []), output.base_ns)
    name = f"step_{step}.trace.json.gz"
    inputs = _inputs(manifest, step, clock_offsets)
    chunks = gzip_stream(_document(root, manifest, step, inputs, output, workers))
    archive = f"step_{step}.perfetto.tar"
    with scratch.replacing(name) as out:
        for chunk in chunks:
            out.write(chunk)
    if output.archived:
        attributes: dict[str, str | int] = {"aprof.run_id": manifest.run_id, "aprof.step": step}
        with scratch.replacing(archive) as out:
            write_archive(out, output.archived, attributes)
    return MergedStep(
        step,
        Path(where[0], *where[1], name),
        output.events,
        tuple(output.merged),
        tuple(output.notes),
        tuple(output.others),
        Path(where[0], *where[1], archive) if output.archived else None,
    )


def _inputs(manifest: Manifest, step: int, clock_offsets: bool = True) -> list[Input]:
    """What goes into ``step``'s trace: every timeline, then each window's files, each
    numbered by its place and moved by its host's clock offset."""
    found: list[Input] = []
    for entry in manifest.timeline:
        driver = entry.process.startswith("driver")
        found.append(
            Input(
                entry.path,
                "driver" if driver else _process_label(entry.process),
                0 if driver else 1,
                timeline_process=entry.process,
                host=entry.host,
            )
        )
    for window in manifest.windows:
        if window.step == step:
            found += _window_inputs(window)
    found.sort(key=lambda item: item.sort)  # the driver first: the archive's reference
    hosts = {f.path: f.host for f in manifest.files}
    offsets = {h.host: h.offset_ns for h in manifest.hosts} if clock_offsets else {}
    scopes: dict[str, int] = {}
    placed = []
    for number, item in enumerate(found):
        host = item.host or hosts.get(item.path)
        placed.append(
            replace(
                item,
                number=number,
                scope=scopes.setdefault(item.timeline_process or item.path, len(scopes)),
                host=host,
                offset_ns=offsets.get(host, 0) if host is not None else 0,
            )
        )
    return placed


_RANK_PROCESS = re.compile(r"(?P<role>.+)-rank(?P<rank>\d+)-\d+")
"""A role's rank's timeline process: ``<role>-rank<k>-<pid>`` (``aprof._workers``)."""


def _process_label(process: str) -> str:
    """What the merged trace calls a timeline's process: a rank's by its role and rank, as
    its captures are (``trainer · rank 0``), another by its own name."""
    found = _RANK_PROCESS.fullmatch(process)
    if found is None:
        return process
    return f"{found['role']} · rank {int(found['rank'])}"


def _worth_workers(root: Path, manifest: Manifest, steps: list[int], size: int) -> bool:
    """Whether one of ``steps`` holds captures enough for worker processes: two Chrome
    traces or more, ``size`` bytes on disk in all (as they are now: no link followed)."""
    for n in steps:
        sizes = []
        for window in manifest.windows:
            if window.step != n:
                continue
            for entry in window.files:
                if is_trace_json(entry.path):
                    try:
                        sizes.append(os.lstat(root / entry.path).st_size)
                    except OSError:
                        continue  # missing: a note later says so
        if len(sizes) > 1 and sum(sizes) >= size:
            return True
    return False


def _window_inputs(window: WindowRecord) -> list[Input]:
    if window.kind == "role":
        return [
            Input(f.path, f"{window.target} · rank {c.rank}", 3 + c.rank)
            for c in window.captures
            for f in c.files
        ] or [Input(f.path, window.target, 3) for f in window.files]
    replica = re.fullmatch(r"replica_(\d+)", window.target)
    number = int(replica.group(1)) if replica else None
    paths = without_merged_copy([f.path for f in window.files])
    return [Input(path, window.target, 2, server=True, replica=number) for path in paths]


def _document(
    root: Path,
    manifest: Manifest,
    step: int,
    inputs: list[Input],
    output: _Output,
    workers: parallel.Workers | None,
) -> Iterator[bytes | Deflated]:
    """The merged trace's JSON text, piece by piece: the inputs in their order, each placed
    here or, where there are workers, by the worker that took it (``parallel.Shares``)."""
    yield b'{"displayTimeUnit":"ms","baseTimeNanoseconds":%d,"traceEvents":[' % output.base_ns
    traces = [item for item in inputs if is_trace_json(item.path)]
    output.others += [item.path for item in inputs if not is_trace_json(item.path)]
    shares = parallel.Shares(
        [item for item in traces if item.timeline_process is None] if workers else []
    )
    if workers is not None:
        workers.serve(shares, root, step, output.base_ns)
    first = True
    try:
        for item in traces:
            part = _by_worker(shares.take(item))
            if part is not None and workers is not None:
                if part.size:
                    if not first:
                        yield b","
                    yield Deflated(workers.read_part(part), part.crc, part.size)
                    first = False
                else:
                    workers.discard(part)
                placed = part.placed
            else:
                scope = output.scopes.setdefault(item.scope, Scope())
                pieces = place(root, step, item, output.base_ns, scope, output.links)
                placed = yield from _joined(pieces, first)
                first = first and not placed.events
            output.take(item, placed)
    finally:
        for future in shares.close().values():  # left early: nothing left behind
            left = _by_worker(future)  # let it end: it writes
            if left is not None and workers is not None:
                workers.discard(left)
    _see_otel(root, step, output)
    first_flow = len(inputs) * FLOWS_PER_INPUT + 1  # above every input's flow ids
    for text, count in texts(list(output.links.events(output.notes, first_flow))):
        yield text if first else b"," + text
        first = False
        output.events += count
    meta = {
        "run_id": manifest.run_id,
        "step": step,
        "clock": "wall clock: each input's baseTimeNanoseconds plus its ts, or its absolute ts; "
        "files from other hosts line up as far as their clocks agree",
        "inputs": output.merged,
        "notes": output.notes,
        "others": output.others,
    }
    yield b'],"aprof":' + json.dumps(meta, ensure_ascii=True).encode() + b"}"


def _by_worker(future: Future[parallel.Part] | None) -> parallel.Part | None:
    """What a worker gave for an input (its text in its part file); ``None`` when no worker
    placed it, or the worker failed (the thread serving it removed its part file)."""
    if future is None:
        return None
    try:
        return future.result()
    except Exception:  # a worker that failed or died: the input is placed here instead
        return None


def _joined(pieces: Generator[bytes, None, Placed], first: bool) -> Generator[bytes, None, Placed]:
    """``pieces`` with the commas between them, and before them unless ``first``."""
    while True:
        try:
            text = next(pieces)
        except StopIteration as done:
            placed: Placed = done.value
            return placed
        yield text if first else b"," + text
        first = False


def _see_otel(root: Path, step: int, output: _Output) -> None:
    """Hand the servers' request spans of ``step`` (what the run's OTLP receiver filed) to the
    links, listed with the other inputs that are not traces; a note for what is unreadable."""
    try:
        with otel_folder(root) as folder:
            found = None if folder is None else read_step(folder, step)
    except OSError as exc:
        output.notes.append(f"{OTEL_FOLDER}/{step_file(step)}: not merged: {unreadable(exc)}")
        return
    if found is None:
        return
    bad = found.bad + output.links.see_otel(found.spans, output.base_ns)
    output.others.append(found.shown)
    if bad:
        output.notes.append(f"{found.shown}: {bad} line(s) not a server's span of a request")
