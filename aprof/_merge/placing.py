"""One input of a merged step placed on the merged clock, read event by event
(``aprof._traces.stream``) and given out as JSON text batch by batch: its events moved by its
clock's offset, with pids, flow ids and async ids of its own, of a timeline only the step's
events, and its processes named (Kineto's one-event tracks folded into the trace's host
process).

The numbers an input gets depend on its place among the step's inputs alone, never on what
the inputs before it held: pids from ``scope * PIDS_PER_SCOPE``, flow ids from
``number * FLOWS_PER_INPUT``. So inputs can be placed in any order, by several processes
(``parallel.py``), and the merged file is the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import orjson

from aprof._merge.archive import ArchiveFile
from aprof._merge.flows import ForwardStep, Links, ServerTrace
from aprof._traces.files import sglang_ranks, unreadable
from aprof._traces.stream import DICTS, open_trace_below

PIDS_PER_SCOPE: Final = 10_000
"""Pids an input (all parts of one timeline together) may name; events of more are left out."""
FLOWS_PER_INPUT: Final = 1 << 32
"""Flow ids an input may name (JSON numbers stay exact: below 2**53 for 2**21 inputs)."""
_FLOW_PHASES = ("s", "t", "f")  # a tuple: a phase may be any JSON value, a list too
_DROPPED_METADATA = {"process_name", "process_labels", "process_sort_index"}
_KINETO_TRACKS = frozenset({"Spans", "Traces", ""})
"""The pids Kineto gives its own tracks (its profiler's span, the iteration's start, the record
window's end): one event each, folded into the trace's host process."""
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True).encode


@dataclass(frozen=True)
class Input:
    """One file to merge, with what the merged trace calls its processes and its place."""

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
    offset_ns: int = 0
    """What to add to its host's wall clock to read the driver's (the manifest's ``hosts``)."""
    number: int = 0
    """Its place among the step's inputs: its flow ids."""
    scope: int = 0
    """Its scope's place (a timeline's parts are one scope): its pids and async ids."""


@dataclass
class Placed:
    """What placing one input gave, besides its text."""

    events: int = 0
    notes: list[str] = field(default_factory=list)
    archived: ArchiveFile | None = None
    """Set when it was merged (in full or up to a cut)."""
    forward: list[ForwardStep] = field(default_factory=list)
    """A replica trace's forward steps that name their requests."""


@dataclass
class Scope:
    """What the parts of one timeline (or one file) share: its pids, its open spans."""

    pids: dict[object, int] = field(default_factory=dict)
    open_ids: dict[object, int] = field(default_factory=dict)
    """A timeline's spans of the step begun and not yet ended, with their open slices."""


def place(
    root: Path, step: int, item: Input, base_ns: int, scope: Scope, links: Links
) -> Generator[bytes, None, Placed]:
    """Place ``item``: its events' text, batch by batch (no leading comma), then what it
    gave. A timeline's request spans go to ``links``; a replica trace's forward steps come
    back in :attr:`Placed.forward`. A note says when it is cut short (what came before the
    cut is merged) or not merged at all."""
    result = Placed()
    placer: _Placer | None = None
    try:
        with open_trace_below(root, item.path, DICTS) as trace:
            clock = trace.clock_ns + item.offset_ns  # on the driver's clock
            label = item.label
            if item.server:
                label = f"{item.label} · {_server_part(item.path, trace.prelude)}"
            placer = _Placer(item, label, clock - base_ns, step, scope)
            server = None if item.replica is None else ServerTrace(item.replica)
            for batch in trace.batches():
                placed = placer.place(batch)
                if item.timeline_process is not None:
                    links.see_timeline(placed)
                elif server is not None:
                    server.see(placed)
                for text, count in texts(placed):
                    result.events += count
                    yield text
            if server is not None:
                result.forward = server.end()
            stopped, read = trace.stopped, trace.events_read
    except Exception as exc:  # a damaged or hostile input costs itself only
        if placer is None or not placer.placed:
            result.notes.append(f"{item.path}: not merged: {unreadable(exc)}")
            return result
        stopped, read = exc, placer.read
    if not placer.placed:  # read, but nothing of it to show: named all the same
        result.notes.append(f"{item.path}: not merged: {placer.why_nothing(read)}")
        return result
    for text, count in texts(placer.finish()):
        result.events += count
        yield text
    if placer.left_out:
        result.notes.append(
            f"{item.path}: {placer.left_out} events of processes past {PIDS_PER_SCOPE} left out"
        )
    if stopped is not None:
        result.notes.append(
            f"{item.path}: cut short after {read} events ({unreadable(stopped)}): "
            "what came before is merged"
        )
    result.archived = ArchiveFile(item.path, root / item.path, clock, item.host)
    return result


def texts(events: list[dict[str, Any]]) -> Iterator[tuple[bytes, int]]:
    """The events as the merged file holds them, with their count: compact JSON in one piece
    by orjson (``NaN`` and ``Infinity`` as ``null``); where orjson cannot (an integer past 64
    bits, a lone surrogate), one by one by the standard library, leaving out what JSON
    cannot hold."""
    if not events:
        return
    try:
        yield orjson.dumps(events)[1:-1], len(events)
        return
    except (TypeError, orjson.JSONEncodeError):
        pass
    found = []
    for event in events:
        try:
            found.append(_ENCODE(event).encode())
        except (ValueError, TypeError, RecursionError):
            continue  # NaN beside a value orjson refused: the event is left out
    if found:
        yield b",".join(found), len(found)


def _server_part(path: str, prelude: dict[str, Any]) -> str:
    """What part of a server wrote ``path``: vLLM's frontend or worker, SGLang's ranks."""
    if "async_llm" in PurePosixPath(path).name:
        return "frontend"
    ranks = sglang_ranks(path)
    if ranks is not None:
        return f"SGLang {ranks}"
    return "vLLM worker" if "vllm_version" in prelude else "server"


@dataclass
class _Placer:
    """Places one input's events, batch by batch (changed in place: they are nobody else's)."""

    item: Input
    label: str
    offset_ns: int
    step: int
    scope: Scope
    read: int = 0
    taken: int = 0
    """Events of the step (of a timeline) or all (of another trace)."""
    names_dropped: int = 0
    placed: int = 0
    left_out: int = 0
    """Events of processes past ``PIDS_PER_SCOPE``."""
    _names: dict[object, str] = field(default_factory=dict)
    _new: list[tuple[object, int]] = field(default_factory=list)
    _host: int | None = None
    """The merged pid of its first process other than Kineto's tracks, which fold into it."""
    _folded: set[object] = field(default_factory=set)
    """Kineto's tracks folded into the host process."""
    _flows: dict[str, int] = field(default_factory=dict)

    def place(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.read += len(events)
        if self.item.timeline_process is not None:
            events = _of_step(events, self.step, self.scope.open_ids)
        self.taken += len(events)
        pids, pid_base = self.scope.pids, self.item.scope * PIDS_PER_SCOPE
        flow_base, tag = self.item.number * FLOWS_PER_INPUT, self.item.scope
        offset_us = self.offset_ns / 1000
        placed: list[dict[str, Any]] = []
        floor, keep = math.floor, placed.append  # looked up once: this loop runs per event
        for event in events:
            ts = event.get("ts")
            if event.get("ph") == "M" and event.get("name") in _DROPPED_METADATA:
                self.names_dropped += 1
                if event.get("name") == "process_name":
                    self._names[event.get("pid")] = str((event.get("args") or {}).get("name", ""))
                continue  # before its pid is taken: a process of nothing but these is not named
            if ts.__class__ is float:  # the common case first: one test for NaN and infinity
                if ts - ts != 0.0:
                    continue
            elif not _usable_ts(ts):
                continue
            if "pid" in event:
                original = event["pid"]
                pid = pids.get(original)
                if pid is None:
                    if original in _KINETO_TRACKS and self._host is not None:
                        self._folded.add(original)
                        pid = self._host
                    elif len(pids) >= PIDS_PER_SCOPE - 1:
                        self.left_out += 1
                        continue
                    else:
                        pid = pids[original] = pid_base + len(pids) + 1
                        self._new.append((original, pid))
                if self._host is None and original not in _KINETO_TRACKS:
                    self._host = pid
                event["pid"] = pid
            if ts is not None:
                # To the nanosecond, as round(x, 3) (which costs five times as much).
                event["ts"] = floor((ts + offset_us) * 1000.0 + 0.5) / 1000.0
            if "id" in event or "bind_id" in event:
                self._own_ids(event, flow_base, tag)
            keep(event)
        self.placed += len(placed)
        return placed

    def _own_ids(self, event: dict[str, Any], flow_base: int, tag: int) -> None:
        """Flow and async ids are global: keep each input's apart."""
        for key in ("id", "bind_id"):
            if key not in event:
                continue
            if key == "bind_id" or event.get("ph") in _FLOW_PHASES:
                # Perfetto reads a flow id as a number (a string as hex): renumber, not tag.
                flow_id = str(event[key])
                number = self._flows.get(flow_id)
                if number is None:
                    number = self._flows[flow_id] = flow_base + len(self._flows) + 1
                event[key] = number
            else:
                event[key] = f"{tag}:{event[key]}"

    def finish(self) -> list[dict[str, Any]]:
        """The names and places of the input's processes, once its events are all placed."""
        found = []
        sort = {"sort_index": self.item.sort * 1_000_000 + self.item.scope}
        for original, pid in self._new:
            name = self.label
            # A torch trace's other processes (its devices, say) or Kineto's tracks: each
            # process is named as the trace names it.
            if len(self.scope.pids) + len(self._folded) > 1:
                name = f"{self.label} · {self._names.get(original) or _pid_name(original)}"
            named = {"ph": "M", "name": "process_name", "pid": pid, "tid": 0}
            found.append({**named, "args": {"name": name}})
            found.append({**named, "name": "process_sort_index", "args": sort})
        return found

    def why_nothing(self, read: int) -> str:
        """Why the input gives the merged trace nothing (``read``: its events)."""
        if not read:
            return "no trace events (no JSON object in its traceEvents)"
        if not self.taken:
            return f"no events of step {self.step}"
        reasons = []
        if self.taken > self.names_dropped:
            reasons.append(
                f"{self.taken - self.names_dropped} without a usable ts (a finite number)"
            )
        if self.names_dropped:
            reasons.append(
                f"{self.names_dropped} naming processes, which the merged trace names itself"
            )
        return f"none of its {self.taken} events can be placed: " + ", ".join(reasons)


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
