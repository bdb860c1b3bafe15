"""What the windows' Chrome traces give: server iteration durations, trainer stage durations
and the stages' names, and the annotations behind them as intervals on one clock. A trace that
cannot be read is a problem of its step, never an exception. How each number is taken:
:mod:`aprof._report`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from aprof._manifest import Manifest, WindowRecord
from aprof._report import clock as _report_clock
from aprof._report.clock import US, interval, number
from aprof._report.model import Interval
from aprof._traces.files import is_trace_json, unreadable, without_merged_copy
from aprof._traces.iterations import Dialect, iteration_dialect
from aprof._traces.stream import Fields, open_trace_below

_T = TypeVar("_T")


class Annotation(msgspec.Struct):
    """The keys of a trace event the report reads (the others, ``args`` above all, are
    skipped unread: three times as fast as reading whole events)."""

    ph: object = None
    cat: object = None
    name: object = None
    ts: object = None
    dur: object = None
    pid: object = None
    tid: object = None


_ANNOTATIONS: Final = Fields(Annotation)


def role_files(window: WindowRecord) -> list[tuple[int | None, str]]:
    """The role window's traces, each with the rank that wrote it where the manifest says."""
    paths: dict[str, int | None] = {}
    for capture in window.captures:
        for f in capture.files:
            paths.setdefault(f.path, capture.rank)
    if not paths:
        paths = dict.fromkeys(f.path for f in window.files)
    return [(rank, path) for path, rank in paths.items() if is_trace_json(path)]


def read_or_note(
    root: Path,
    path: str,
    problems: list[tuple[int, str]],
    take: Callable[[Iterable[Annotation], int | None], _T],
) -> _T | None:
    """``take`` of the trace's events at ``path`` (read as they are taken, never held) and of
    its time base (the wall-clock ns its ``ts`` 0 stands for; ``None`` when it is on no known
    clock); ``None``, with a problem, when it cannot be read. A trace cut short gives what
    came before the cut, with a problem."""
    try:
        with open_trace_below(root, path, _ANNOTATIONS) as trace:
            try:
                base: int | None = trace.clock_ns
            except ValueError:
                base = None
            found = take((e for batch in trace.batches() for e in batch), base)
            if trace.stopped is not None:
                why = unreadable(trace.stopped)
                problems.append((4, f"{path}: cut short after {trace.events_read} events: {why}"))
            return found
    except Exception as exc:  # a damaged trace costs its own numbers only
        problems.append((4, f"{path}: unreadable: {unreadable(exc)}"))
        return None


@dataclass
class _Found:
    """A trace's iterations: every duration (s), and the earliest as intervals."""

    durations: array[float] = field(default_factory=lambda: array("d"))
    items: list[Interval] = field(default_factory=list)
    placed: int = 0
    """How many were on a known clock: ``items`` and those left out."""
    last_end_ns: int | None = None
    """The end of the latest on a known clock (wall clock, ns)."""


def iterations(root: Path, window: WindowRecord, problems: list[tuple[int, str]]) -> _Found | None:
    """The window's iterations, from the trace holding the most; ``None`` when no trace
    holds any."""
    best: _Found | None = None
    for path in without_merged_copy([f.path for f in window.files]):
        if not is_trace_json(path):
            continue
        found = read_or_note(root, path, problems, _iteration_durations)
        count = 0 if found is None else len(found.durations)
        if count > 0 and (best is None or count > len(best.durations)):
            best = found
    return best


def _annotations(
    events: Iterable[Annotation],
) -> Iterable[tuple[str, float | None, float, Annotation]]:
    """The name, ``ts`` (µs; ``None`` when it is no number) and duration (µs) of each
    CPU-side ``record_function`` range of a trace, with the event."""
    for event in events:
        name = event.name
        if event.ph == "X" and event.cat == "user_annotation" and isinstance(name, str):
            dur = number(event.dur)
            if dur is not None and dur >= 0:
                yield name, number(event.ts), dur, event


def _placed(base_ns: int | None, ts: float | None, dur: float, label: str) -> Interval | None:
    if base_ns is None or ts is None:
        return None
    return interval(base_ns, ts, dur, label)


def _iteration_durations(events: Iterable[Annotation], base_ns: int | None) -> _Found:
    by_dialect: dict[Dialect, _Found] = {}
    for name, ts, dur, _ in _annotations(events):
        dialect = iteration_dialect(name)
        if dialect is None:
            continue
        found = by_dialect.setdefault(dialect, _Found())
        found.durations.append(dur * US)
        item = _placed(base_ns, ts, dur, name)
        if item is not None:
            found.items.append(item)
            found.placed += 1
            if found.last_end_ns is None or item.end_ns > found.last_end_ns:
                found.last_end_ns = item.end_ns
            if len(found.items) >= 2 * _report_clock.TIMELINE_ITEMS:
                _earliest(found.items)
    for dialect in ("reference", "vllm", "sglang"):  # the reference server's holds vLLM's
        if dialect in by_dialect:
            found = by_dialect[dialect]
            _earliest(found.items)
            return found
    return _Found()


def _earliest(items: list[Interval]) -> None:
    items.sort(key=lambda item: item.begin_ns)
    del items[_report_clock.TIMELINE_ITEMS :]


def stages(
    events: Iterable[Annotation], base_ns: int | None, names: set[str]
) -> tuple[dict[str, list[float]], list[Interval], int]:
    """The durations (s) of each stage's ranges, and as intervals the stage ranges, else (none
    in this trace) the top-level ranges: the earliest ``TIMELINE_ITEMS``, and how many there
    were."""
    found: dict[str, list[float]] = {}
    ranges: list[Interval] = []
    top: list[tuple[object, float, float, str]] = []
    for name, ts, dur, event in _annotations(events):
        if name in names:
            found.setdefault(name, []).append(dur * US)
            item = _placed(base_ns, ts, dur, name)
            if item is not None:
                ranges.append(item)
        elif ts is not None and base_ns is not None:
            top.append(((event.pid, event.tid), ts, dur, name))
    if not ranges:
        top.sort(key=lambda t: (str(t[0]), t[1], -t[2]))
        ends: dict[str, float] = {}
        for thread, ts, dur, name in top:
            key = str(thread)
            if ts < ends.get(key, -math.inf):
                continue  # inside a range already taken: not top-level
            ends[key] = ts + dur
            item = _placed(base_ns, ts, dur, name)
            if item is not None:
                ranges.append(item)
    placed = len(ranges)
    _earliest(ranges)
    return found, ranges, placed


def stage_names(manifest: Manifest) -> dict[str, set[str]]:
    """Per role: the stages its discrete captures were of, anywhere in the run."""
    names: dict[str, set[str]] = {}
    for window in manifest.windows:
        for capture in window.captures:
            if capture.stage is not None:
                names.setdefault(window.target, set()).add(capture.stage)
    return names
