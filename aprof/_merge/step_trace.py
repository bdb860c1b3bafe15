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
unreadable, truncated, too large, on no known clock or without one event that can be placed
(a timeline: none of the step) is left out and named in a note, with why; the rest is merged:
every input is either merged or named. Memory holds one input at a time; the merged file is
written as it goes, atomically. Where a replica's trace names the requests of its forward
steps, flow arrows link each request span to them (``flows.py``).
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from aprof._config import StepSelection
from aprof._manifest import Manifest, WindowRecord, load_manifest
from aprof._merge.archive import ArchiveFile
from aprof._merge.archive import write as write_archive
from aprof._merge.flows import Links
from aprof._otel import FOLDER as OTEL_FOLDER
from aprof._otel import Collected, collected_spans, otel_folder, read_step, step_file
from aprof._safe_files import open_folder, replace_file
from aprof._trace_json import is_trace_json, read_trace_below, time_base, unreadable

FOLDER = "merged"
"""Where the merged traces go, below ``save_path`` unless told otherwise."""
MAX_INPUT_BYTES = 2 << 30
"""The largest input taken, compressed or not (the profiler's default ``max_window_bytes``)."""
_CHUNK = 1 << 20
_FLOW_PHASES = ("s", "t", "f")  # a tuple: a phase may be any JSON value, a list too
_DROPPED_METADATA = {"process_name", "process_labels", "process_sort_index"}


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
class _Input:
    """One file to merge, with what the merged trace calls its processes."""

    path: str
    """Relative to ``save_path``."""
    label: str
    """What the merged trace calls its processes (a server's file: with the part of it)."""
    sort: int
    timeline_process: str | None = None
    """Set for a timeline part: take only the step's events."""
    host: str | None = None
    """The host that wrote it, where the manifest says."""
    server: bool = False
    """A rollout server's file: its part (worker, frontend) completes the label."""
    replica: int | None = None
    """The replica a rollout server's file belongs to, when its target's name says
    (``replica_<r>``): its forward steps are linked to that replica's requests."""


@dataclass
class _Output:
    base_ns: int
    events: int = 0
    next_pid: int = 1
    next_flow: int = 1
    """The next flow id: flows are numbered anew across the merged file."""
    notes: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    archived: list[ArchiveFile] = field(default_factory=list)
    """The merged inputs, as the trace archive holds them."""
    scopes: dict[str, int] = field(default_factory=dict)
    """Each process's (timeline) or file's index: what keeps its ids apart from others'."""
    pids: dict[str, dict[object, int]] = field(default_factory=dict)
    """Per scope: its pids in the merged trace, by their own."""
    open_ids: dict[str, dict[object, int]] = field(default_factory=dict)
    """Per timeline process: the ids of the step's spans begun and not yet ended, with how
    many of their nested slices are open."""
    links: Links = field(default_factory=Links)
    """The step's request spans and forward steps that name them: the flow arrows."""


def merge(
    save_path: str | os.PathLike[str],
    *,
    steps: StepSelection | Iterable[int] | None = None,
    out: str | os.PathLike[str] | None = None,
    otel: str | os.PathLike[str] | None = None,
) -> list[MergedStep]:
    """Merge each profiled step of the run in ``save_path`` (or ``steps``) into
    ``<out>/step_<n>.trace.json.gz`` (``out`` defaults to ``save_path/merged``). The servers'
    own spans of its requests come from the run's receiver (``save_path/otel/``) and from
    ``otel``, a folder of files an OpenTelemetry collector's file exporter wrote (OTLP JSON,
    one export per line).

    Raises ``ManifestError`` when ``save_path`` holds no readable manifest and ``ValueError``
    for a step the run did not profile; an input that cannot be merged is a note instead.
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
    return [_merge_step(root, manifest, n, where, collected) for n in chosen]


def _merge_step(
    root: Path,
    manifest: Manifest,
    step: int,
    where: tuple[str, list[str]],
    collected: Collected,
) -> MergedStep:
    output = _Output(base_ns=manifest.clock.wall_ns)
    output.notes += collected.notes
    output.links.see_otel(collected.by_step.get(step, []), output.base_ns)
    name = f"step_{step}.trace.json.gz"
    chunks = _gzip(_document(root, manifest, step, _inputs(manifest, step), output))
    archive = f"step_{step}.perfetto.tar"
    folder = open_folder(where[0], where[1], create=True)
    try:
        replace_file(folder, name, chunks)
        if output.archived:
            attributes: dict[str, str | int] = {"aprof.run_id": manifest.run_id, "aprof.step": step}
            write_archive(folder, archive, output.archived, attributes)
    finally:
        os.close(folder)
    return MergedStep(
        step,
        Path(where[0], *where[1], name),
        output.events,
        tuple(output.merged),
        tuple(output.notes),
        tuple(output.others),
        Path(where[0], *where[1], archive) if output.archived else None,
    )


def _inputs(manifest: Manifest, step: int) -> list[_Input]:
    """What goes into ``step``'s trace: every timeline, then each window's files."""
    found: list[_Input] = []
    for entry in manifest.timeline:
        driver = entry.process.startswith("driver")
        found.append(
            _Input(
                entry.path,
                "driver" if driver else entry.process,
                0 if driver else 1,
                timeline_process=entry.process,
                host=entry.host,
            )
        )
    for window in manifest.windows:
        if window.step == step:
            found += _window_inputs(window)
    return sorted(found, key=lambda item: item.sort)  # the driver first: the archive's reference


def _window_inputs(window: WindowRecord) -> list[_Input]:
    if window.kind == "role":
        return [
            _Input(f.path, f"{window.target} · rank {c.rank}", 3 + c.rank)
            for c in window.captures
            for f in c.files
        ] or [_Input(f.path, window.target, 3) for f in window.files]
    replica = re.fullmatch(r"replica_(\d+)", window.target)
    number = int(replica.group(1)) if replica else None
    return [_Input(f.path, window.target, 2, server=True, replica=number) for f in window.files]


def _server_part(path: str, data: dict[str, Any]) -> str:
    """What part of a server wrote ``path``: vLLM's frontend or worker, an SGLang TP rank."""
    name = PurePosixPath(path).name
    if "async_llm" in name:
        return "frontend"
    tp = re.search(r"TP-(\d+)", name)
    if tp:
        return f"SGLang TP {tp.group(1)}"
    return "vLLM worker" if "vllm_version" in data else "server"


def _document(
    root: Path, manifest: Manifest, step: int, inputs: list[_Input], output: _Output
) -> Iterator[bytes]:
    """The merged trace's JSON text, piece by piece."""
    yield b'{"displayTimeUnit":"ms","baseTimeNanoseconds":%d,"traceEvents":[' % output.base_ns
    first = True
    for item in inputs:
        if not is_trace_json(item.path):
            output.others.append(item.path)
            continue
        try:
            source = root / item.path
            data = read_trace_below(root, item.path, MAX_INPUT_BYTES)
            read = _events(data)
            base = time_base(data, read)
            label = f"{item.label} · {_server_part(item.path, data)}" if item.server else item.label
            events = read
            if item.timeline_process is not None:  # only the step's events
                open_ids = output.open_ids.setdefault(item.timeline_process, {})
                events = _of_step(read, step, open_ids)
            placed = list(_placed(events, item, label, base - output.base_ns, output))
            texts = list(_texts(placed))
            _collect_links(item, placed, output.links)
            empty = None if texts else _nothing_placed(read, events, step)
            del data, read, events, placed  # the text is all that is left to write
        except Exception as exc:  # a damaged or hostile input costs itself only
            output.notes.append(f"{item.path}: not merged: {unreadable(exc)}")
            continue
        if empty is not None:  # read, but nothing of it to show: named all the same
            output.notes.append(f"{item.path}: not merged: {empty}")
            continue
        output.merged.append(item.path)
        output.archived.append(ArchiveFile(item.path, source, base, item.host))
        for text, count in texts:
            yield text if first else b"," + text
            first = False
            output.events += count
    _see_otel(root, step, output)
    for text, count in _texts(list(output.links.events(output.notes, output.next_flow))):
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


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True).encode
_BATCH = 2000
"""Events encoded per call: one call per event would cost more than the encoding."""


def _texts(events: list[dict[str, Any]]) -> Iterator[tuple[bytes, int]]:
    """The events as the merged file holds them, a batch at a time, with their count:
    compact ASCII JSON, never NaN or Infinity."""
    for start in range(0, len(events), _BATCH):
        batch = events[start : start + _BATCH]
        yield _ENCODE(batch)[1:-1].encode(), len(batch)


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


def _collect_links(item: _Input, placed: list[dict[str, Any]], links: Links) -> None:
    """Hand a merged input's placed events to ``links``: a timeline's request spans, a
    replica's forward steps."""
    if item.timeline_process is not None:
        links.see_timeline(placed)
    elif item.replica is not None:
        links.see_server(placed, item.replica)


def _events(data: dict[str, Any]) -> list[dict[str, Any]]:
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def _nothing_placed(read: list[dict[str, Any]], taken: list[dict[str, Any]], step: int) -> str:
    """Why an input gives the merged trace nothing: ``read`` its events, ``taken`` those of
    them it would give (a timeline's: those of ``step``), every one left out."""
    if not read:
        return "no trace events (no JSON object in its traceEvents)"
    if not taken:
        return f"no events of step {step}"
    names = sum(1 for e in taken if _dropped(e))
    reasons = []
    if len(taken) > names:
        reasons.append(f"{len(taken) - names} without a usable ts (a finite number)")
    if names:
        reasons.append(f"{names} naming processes, which the merged trace names itself")
    return f"none of its {len(taken)} events can be placed: " + ", ".join(reasons)


def _dropped(event: dict[str, Any]) -> bool:
    """Whether ``event`` is process metadata the merged trace writes anew."""
    return event.get("ph") == "M" and event.get("name") in _DROPPED_METADATA


def _usable_ts(ts: object) -> bool:
    """Whether ``ts`` is absent (metadata) or a finite number."""
    if ts is None:
        return True
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        return False
    try:
        return math.isfinite(ts)
    except OverflowError:  # an integer beyond any float
        return False


def _placed(
    events: list[dict[str, Any]],
    item: _Input,
    label: str,
    offset_ns: int,
    output: _Output,
) -> Iterator[dict[str, Any]]:
    """The input's ``events`` (a timeline's: those of the step) moved by ``offset_ns`` onto the
    merged clock, with pids of their own, its processes named ``label`` first."""
    # A timeline's parts are one process: they share its pids and ids.
    scope = item.timeline_process or item.path
    tag = output.scopes.setdefault(scope, len(output.scopes))
    # Taken from the output once the whole input is placed: a damaged one leaves no trace.
    pids = dict(output.pids.get(scope, {}))
    next_pid = output.next_pid
    names: dict[object, str] = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            names[event.get("pid")] = str((event.get("args") or {}).get("name", ""))
    new: list[tuple[object, int]] = []
    flows: dict[str, int] = {}  # this input's flow ids, renumbered
    for event in events:
        ts = event.get("ts")
        if _dropped(event) or not _usable_ts(ts):
            continue  # before its pid is taken: a process of nothing but these is not named
        placed = event  # parsed here, nobody else's: changed in place
        if "pid" in placed:
            pid = pids.get(placed["pid"])
            if pid is None:
                pid = pids[placed["pid"]] = next_pid
                next_pid += 1
                new.append((placed["pid"], pid))
            placed["pid"] = pid
        if ts is not None:
            placed["ts"] = round(ts + offset_ns / 1000, 3)
        for key in ("id", "bind_id"):  # flow and async ids are global: keep each input's apart
            if key not in placed:
                continue
            if key == "bind_id" or placed.get("ph") in _FLOW_PHASES:
                # Perfetto reads a flow id as a number (a string as hex): renumber, not tag.
                flow_id = str(placed[key])
                if flow_id not in flows:
                    flows[flow_id] = output.next_flow
                    output.next_flow += 1
                placed[key] = flows[flow_id]
            else:
                placed[key] = f"{tag}:{placed[key]}"
        yield placed
    output.pids[scope], output.next_pid = pids, next_pid
    for original, pid in new:
        name = label
        if len(pids) > 1:  # a torch trace's other processes: its devices, say
            name = f"{label} · {names.get(original) or _pid_name(original)}"
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        yield {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": item.sort * 1000 + pid},
        }


def _pid_name(pid: object) -> str:
    if isinstance(pid, int):
        return f"pid {pid}"
    return str(pid) or "unnamed"  # Kineto names some pseudo-processes by their pid


def _of_step(
    events: list[dict[str, Any]], step: int, open_ids: dict[object, int]
) -> list[dict[str, Any]]:
    """A timeline's events of ``step``: those that say so, the events of the spans they begin
    until those end (nested slices share their span's id; an end may come in a later part of
    the timeline), and the metadata."""
    kept = []
    for event in events:
        phase, args = event.get("ph"), event.get("args")
        span = _span_id(event)
        ours = isinstance(args, dict) and args.get("step") == step
        if phase == "M" or ours or (span is not None and span in open_ids):
            kept.append(event)
        if span is None or not (ours or span in open_ids):
            continue
        if phase == "b":
            open_ids[span] = open_ids.get(span, 0) + 1
        elif phase == "e":
            depth = open_ids.pop(span, 1) - 1
            if depth > 0:
                open_ids[span] = depth
    return kept


def _span_id(event: dict[str, Any]) -> object:
    ids = event.get("id2")
    if isinstance(ids, dict):
        return ("id2", str(ids.get("local", ids.get("global"))), event.get("cat"))
    if "id" in event:
        return ("id", str(event["id"]), event.get("cat"))
    return None


def _gzip(pieces: Iterable[bytes]) -> Iterator[bytes]:
    deflate = zlib.compressobj(1, zlib.DEFLATED, 31)  # speed over ratio, as the timeline
    buffered: list[bytes] = []
    size = 0
    for piece in pieces:
        buffered.append(piece)
        size += len(piece)
        if size >= _CHUNK:
            yield deflate.compress(b"".join(buffered))
            buffered, size = [], 0
    yield deflate.compress(b"".join(buffered)) + deflate.flush()
