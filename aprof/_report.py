"""What a run captured, step by step: the numbers behind ``aprof report``.

:func:`collect` reads a run back from its ``save_path``: the manifest (every window), every
timeline part it lists (aprof's request and capture spans) and the Chrome JSON traces of every
window (the servers' iterations, the trainer's stages). Each input is read below ``save_path``
without following a link, at most ``MAX_INPUT_BYTES`` of JSON, one at a time; one that cannot
be read is a problem line of the report, never an exception, and the rest is reported.

- **Request latency**: each ``request`` span of a timeline (its ``b`` and ``e`` paired by
  ``id2.local``), end minus begin. Per profiled step, split by the span's ``captured`` flag;
  run-wide, the requests of profiled steps against those of the steps without a window.
- **Gated wait**: a gated request of replica ``r`` in step ``n`` waited from its begin until
  the ``starting`` slice of step ``n``'s ``capture replica_<r>`` span ended (the capture became
  active, or its start ended otherwise), at least 0. Placed by wall clock
  (``baseTimeNanoseconds`` + ``ts``): requests and captures may be on different processes'
  timelines.
- **Iterations**: per rollout window, the ``user_annotation`` ``X`` slices of its traces named as
  an engine names one iteration (``aprof._iterations``: the reference server's
  ``forward_step#<k>``, which in its vLLM dialect holds vLLM's own annotation and so is taken
  alone when a trace has it; else vLLM's ``execute_..._context_...(`` or SGLang's ``step[``),
  from the trace that holds the most (each rank of a server writes the same iterations).
- **Stages**: per role window, the ``user_annotation`` ``X`` slices of every rank's traces named
  as a stage of that role (the stages of the role's discrete captures anywhere in the run: a
  stage range looks like any other ``record_function`` range, so a role captured only
  continuously has no stage durations).

- **One clock**: per profiled step, the intervals ``report.html`` draws as "Step <n> on one
  clock" (``StepReport.timeline``): the step's span, each window, each request span, each
  forward step of the trace its iterations come from, each trainer rank's stage ranges (else
  its top-level ``record_function`` ranges), all on the wall clock in ns, gathered while the
  inputs are read for the numbers above (no file is read twice). At most ``TIMELINE_ITEMS``
  requests, forward steps and ranges per step, the earliest; each row counts those left out.

Percentiles are nearest-rank: the p-th of ``n`` sorted values is the ``ceil(p/100 * n)``-th,
always one of the values. Memory: the values of one profiled step are kept (8 bytes each, in
``array('d')``) until its report is made; the run-wide distributions keep their exact count and
a uniform reservoir of at most ``RUN_VALUES`` values (800 kB each), from which their percentiles
and sample come: exact up to ``RUN_VALUES`` requests, an estimate beyond (Algorithm R, seeded,
so the same run gives the same report).
"""

from __future__ import annotations

import math
import os
import random
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from aprof._iterations import Dialect, iteration_dialect
from aprof._manifest import Manifest, WindowRecord, load_manifest
from aprof._trace_json import read_trace_below, time_base, unreadable

SAMPLE = 2000
"""The most values a ``Distribution.sample`` holds."""
RUN_VALUES = 100_000
"""The most values the run-wide latency distributions keep for their percentiles."""
MAX_INPUT_BYTES = 2 << 30
"""The largest input read, compressed or not (as ``aprof merge``)."""
TIMELINE_ITEMS = 5000
"""The most requests, forward steps and ranges a step's ``timeline`` keeps (the earliest)."""
_US = 1e-6
_MAX_NS = 1 << 62
"""Instants past this (the year 2116) or before the epoch are on no clock the report draws."""
_T = TypeVar("_T")


@dataclass(frozen=True)
class Distribution:
    """Durations in seconds: how many there were, their percentiles, and a bounded sample."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    sample: tuple[float, ...] = ()
    """At most ``SAMPLE`` of the values, spread evenly over their sorted order (for plots)."""


@dataclass(frozen=True)
class WindowRow:
    """One capture window as the manifest records it, with its files summed."""

    step: int
    target: str
    kind: str
    """``rollout`` or ``role``."""
    tool: str
    state: str
    stop_reason: str | None
    started_ns: int | None
    stopped_ns: int | None
    requested: int | None
    """Forward steps asked for (rollout windows)."""
    observed: int | None
    """Forward steps the capture saw."""
    admitted: int
    gated: int
    files: int
    bytes: int
    error: str | None


@dataclass(frozen=True)
class Interval:
    """Something that took time, on the wall clock (ns since the epoch)."""

    begin_ns: int
    end_ns: int
    label: str
    state: str | None = None
    """A window's state; ``captured`` or ``uncaptured`` for a request."""


@dataclass(frozen=True)
class Row:
    """One row of a step's picture on one clock: its intervals, earliest first."""

    name: str
    items: tuple[Interval, ...]
    kind: str
    """``step``, ``window``, ``requests``, ``iterations`` or ``ranges``."""
    left_out: int = 0
    """Its intervals not kept: past the step's ``TIMELINE_ITEMS``."""


@dataclass(frozen=True)
class StepReport:
    """One profiled step."""

    step: int
    windows: tuple[WindowRow, ...]
    latency_captured: Distribution
    """Requests of this step that went ahead while their replica's capture was active."""
    latency_uncaptured: Distribution
    gated_wait: Distribution
    """Of the gated requests: from the request's start until its replica's capture was
    active (or its start ended otherwise)."""
    iterations: dict[str, Distribution]
    """Per rollout target: server iteration (forward step) durations read from its traces."""
    stages: dict[str, Distribution]
    """Per ``<role> · <stage>``: trainer stage durations read from the role windows' traces."""
    problems: tuple[str, ...]
    """Failed, timed-out or skipped windows, observed != requested, unreadable traces."""
    timeline: tuple[Row, ...] = ()
    """The step on one clock, top to bottom: its span, each window, per replica its requests
    and forward steps, per role and rank its stage (or top-level) ranges."""


@dataclass(frozen=True)
class RunReport:
    """A whole run: its profiled steps and the requests of profiled vs unprofiled steps."""

    run_id: str
    save_path: Path
    steps: tuple[StepReport, ...]
    latency_profiled: Distribution
    """Every request of the profiled steps."""
    latency_unprofiled: Distribution
    """Every request of the steps that were not profiled (the observer effect's baseline)."""
    problems: tuple[str, ...] = ()
    """Run-wide: notes of no step, dropped timeline events, unreadable timelines."""
    notes: tuple[str, ...] = field(default=())
    """Things to know that are not problems (the manifest's notes of each step)."""
    html: Path | None = None
    """Where :func:`report` wrote the HTML report; ``None`` from :func:`collect`."""


def report(save_path: str | os.PathLike[str], *, html: bool = True) -> RunReport:
    """The report of the run in ``save_path`` (:func:`collect`); unless ``html`` is false, also
    written to ``save_path/report.html`` (atomically, following no link below ``save_path``),
    whose path the report's ``html`` holds.

    Raises ``ManifestError`` when ``save_path`` holds no readable manifest, and ``OSError``
    when ``report.html`` cannot be written; an input that cannot be read is a problem line.
    """
    collected = collect(save_path)
    return with_html(collected, save_path) if html else collected


def with_html(collected: RunReport, save_path: str | os.PathLike[str]) -> RunReport:
    """``collected`` written to ``save_path/report.html``, with its path (raises ``OSError``)."""
    from aprof._report_html import write  # the HTML renderer only when it is wanted

    return replace(collected, html=write(collected, save_path))


def collect(save_path: str | os.PathLike[str]) -> RunReport:
    """Read the run in ``save_path`` back into a report.

    Raises ``ManifestError`` when ``save_path`` holds no readable manifest; every other input
    that cannot be read (a timeline, a trace: missing, truncated, not JSON, a link) is named in
    the report's problems and the rest is reported.
    """
    root = Path(save_path)
    manifest = load_manifest(root)
    by_step: dict[int, list[WindowRecord]] = defaultdict(list)
    for window in manifest.windows:
        by_step[window.step].append(window)
    requests = _Requests(set(by_step))
    problems = [f"{n.text}" for n in manifest.notes if n.step is None]
    for entry in manifest.timeline:
        if entry.dropped > 0:
            problems.append(
                f"{entry.path}: {entry.dropped} timeline events dropped "
                "(raise timeline.buffer_events)"
            )
        try:  # passed on, not kept: one input in memory at a time
            requests.add_file(read_trace_below(root, entry.path, MAX_INPUT_BYTES), entry.process)
        except Exception as exc:  # a damaged timeline costs its own spans only
            problems.append(f"{entry.path}: timeline unreadable: {unreadable(exc)}")
    stages = _stage_names(manifest)
    steps = tuple(_step_report(root, n, by_step[n], requests, stages) for n in sorted(by_step))
    notes = tuple(
        f"step {n.step}{f' {n.target}' if n.target else ''}: {n.text}"
        for n in manifest.notes
        if n.step is not None
    )
    if not manifest.timeline:
        notes += ("no timeline in this run (timeline.enable: false?): no request latencies",)
    return RunReport(
        run_id=manifest.run_id,
        save_path=root,
        steps=steps,
        latency_profiled=requests.profiled.distribution(),
        latency_unprofiled=requests.unprofiled.distribution(),
        problems=tuple(problems),
        notes=notes,
    )


# -- distributions ---------------------------------------------------------------------------


def distribution(values: Sequence[float], count: int | None = None) -> Distribution:
    """The nearest-rank percentiles and an even sample of ``values`` (seconds); ``count``
    when ``values`` is a sample of more."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return Distribution(count=count or 0)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * n) - 1)]

    if n <= SAMPLE:
        sample = tuple(ordered)
    else:
        sample = tuple(ordered[round(i * (n - 1) / (SAMPLE - 1))] for i in range(SAMPLE))
    return Distribution(
        count=n if count is None else count,
        p50=rank(50),
        p95=rank(95),
        p99=rank(99),
        sample=sample,
    )


class _Reservoir:
    """Every value counted, at most ``size`` kept: a uniform sample of them (Algorithm R)."""

    def __init__(self, size: int = RUN_VALUES) -> None:
        self.size = size
        self.count = 0
        self.values = array("d")
        self._random = random.Random(0)  # a sample, not a secret

    def add(self, value: float) -> None:
        self.count += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._random.randrange(self.count)
        if slot < self.size:
            self.values[slot] = value

    def distribution(self) -> Distribution:
        return distribution(self.values, self.count)


# -- timelines -------------------------------------------------------------------------------


@dataclass
class _StepRequests:
    captured: array[float] = field(default_factory=lambda: array("d"))
    uncaptured: array[float] = field(default_factory=lambda: array("d"))
    gated_replica: array[int] = field(default_factory=lambda: array("q"))
    gated_begin_us: array[float] = field(default_factory=lambda: array("d"))
    """Wall clock, µs since the epoch."""


class _Requests:
    """What the timelines say: request latencies by step, gated requests, capture starts."""

    def __init__(self, profiled: set[int]) -> None:
        self.profiled_steps = profiled
        self.steps: dict[int, _StepRequests] = {}
        self.profiled = _Reservoir()
        self.unprofiled = _Reservoir()
        self.spans: dict[int, _Earliest] = {}
        """Per profiled step: its request spans, the earliest ``TIMELINE_ITEMS``."""
        self.step_spans: dict[int, Interval] = {}
        """Per profiled step: the driver's ``step`` slice."""
        self.started_us: dict[tuple[int, str], float] = {}
        """(step, target) -> when its capture's ``starting`` slice ended, wall-clock µs."""
        self._open: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
        """Per process: the request spans begun in one part and not yet ended."""

    def add_file(self, data: dict[str, Any], process: str) -> None:
        """Take one timeline part's requests and capture starts; nothing of it if it fails."""
        base = data.get("baseTimeNanoseconds")
        if not isinstance(base, int) or isinstance(base, bool):
            raise ValueError("on no known clock (no baseTimeNanoseconds)")
        base_us = base / 1000
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError("no traceEvents list")
        begun = dict(self._open.get(process, {}))
        done: list[tuple[float, float, dict[str, Any]]] = []
        captures: dict[str, tuple[int, str]] = {}
        started: dict[tuple[int, str], float] = {}
        step_spans: dict[int, Interval] = {}
        for event in events:
            if not isinstance(event, dict):
                continue
            ts = _number(event.get("ts"))
            if ts is None:
                continue
            cat, phase = event.get("cat"), event.get("ph")
            key = _local_id(event)
            if cat == "step" and phase == "X":
                step = _integer(_arg(event, "step"))
                span = _interval(base, ts, _number(event.get("dur")), f"step {step}")
                if step in self.profiled_steps and span is not None:
                    step_spans.setdefault(step, span)
            elif cat == "request" and key is not None:
                if phase == "b":
                    args = event.get("args")
                    begun[key] = (ts, args if isinstance(args, dict) else {})
                elif phase == "e" and key in begun:
                    begin, args = begun.pop(key)
                    done.append((begin, ts, args))
            elif cat == "capture" and key is not None:
                args = event.get("args")
                name = event.get("name")
                window = _window_of(args)
                if phase == "b" and window is not None:
                    captures[key] = window
                elif phase == "e" and name == "starting" and key in captures:
                    started.setdefault(captures[key], ts + base_us)
                elif phase == "n" and window is not None:
                    started.setdefault(window, ts + base_us)  # never started, or after it
        # The whole part is read: now it counts.
        self._open[process] = begun
        for window, when in started.items():
            self.started_us.setdefault(window, when)
        for step, span in step_spans.items():
            self.step_spans.setdefault(step, span)
        for begin, end, args in done:
            self._request(
                begin + base_us, end + base_us, args, _interval(base, begin, end - begin, "")
            )

    def _request(
        self, begin_us: float, end_us: float, args: dict[str, Any], span: Interval | None
    ) -> None:
        """One request span: ``begin_us`` and ``end_us`` on the wall clock, ``span`` as
        exactly (ns), when it is on the clock the report draws."""
        step = _integer(args.get("step"))
        latency = (end_us - begin_us) * _US
        if step is None or not latency >= 0:
            return
        if step not in self.profiled_steps:
            self.unprofiled.add(latency)
            return
        self.profiled.add(latency)
        mine = self.steps.setdefault(step, _StepRequests())
        (mine.captured if args.get("captured") is True else mine.uncaptured).append(latency)
        replica = _integer(args.get("replica"))
        if args.get("gated") is True and replica is not None and abs(replica) < 1 << 62:
            mine.gated_replica.append(replica)
            mine.gated_begin_us.append(begin_us)
        request_id = args.get("request_id")
        label = f"request {request_id}" if isinstance(request_id, str) else "request"
        if args.get("gated") is True:
            label += " · gated"
        state = "captured" if args.get("captured") is True else "uncaptured"
        if span is not None:
            span = replace(span, label=label, state=state)
            row = "requests" if replica is None else f"requests → replica_{replica}"
            self.spans.setdefault(step, _Earliest()).add(row, span)


class _Earliest:
    """The earliest ``cap`` intervals added, each with its row, and how many of each row
    were added: memory for at most twice ``cap`` at a time."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = TIMELINE_ITEMS if cap is None else cap
        self.items: list[tuple[str, Interval]] = []
        self.seen: dict[str, int] = {}

    def add(self, row: str, item: Interval) -> None:
        self.seen[row] = self.seen.get(row, 0) + 1
        self.items.append((row, item))
        if len(self.items) >= 2 * max(self.cap, 1):
            self._trim()

    def add_many(self, row: str, items: Iterable[Interval], seen: int) -> None:
        """``items`` of ``row``, the earliest of ``seen`` (the rest left out already)."""
        self.seen[row] = self.seen.get(row, 0) + seen
        for item in items:
            self.items.append((row, item))
            if len(self.items) >= 2 * max(self.cap, 1):
                self._trim()

    def _trim(self) -> None:
        self.items.sort(key=lambda pair: pair[1].begin_ns)  # stable: ties in the order seen
        del self.items[self.cap :]

    def rows(self) -> dict[str, tuple[list[Interval], int]]:
        """Per row: its kept intervals, earliest first, and how many were left out."""
        self._trim()
        kept: dict[str, list[Interval]] = {row: [] for row in self.seen}
        for row, item in self.items:
            kept[row].append(item)
        return {row: (items, self.seen[row] - len(items)) for row, items in kept.items()}


def _interval(
    base_ns: int, ts_us: float, dur_us: float | None, label: str, state: str | None = None
) -> Interval | None:
    """An interval from a file's time base (ns), a ``ts`` and a duration (µs); ``None`` when
    the duration is no number or negative, or the interval is off the clock the report
    draws."""
    if dur_us is None or not dur_us >= 0 or abs(base_ns) >= _MAX_NS:
        return None
    begin, end = ts_us * 1000, (ts_us + dur_us) * 1000
    if not (-_MAX_NS < begin <= end < _MAX_NS):  # also false for NaN and infinities
        return None
    begin_ns, end_ns = base_ns + round(begin), base_ns + round(end)
    if not 0 <= begin_ns <= end_ns < _MAX_NS:
        return None
    return Interval(begin_ns, end_ns, label, state)


def _arg(event: dict[str, Any], name: str) -> object:
    args = event.get("args")
    return args.get(name) if isinstance(args, dict) else None


def _window_of(args: object) -> tuple[int, str] | None:
    if not isinstance(args, dict):
        return None
    step, target = _integer(args.get("step")), args.get("target")
    return None if step is None or not isinstance(target, str) else (step, target)


def _local_id(event: dict[str, Any]) -> str | None:
    ids = event.get("id2")
    if isinstance(ids, dict) and "local" in ids:
        return str(ids["local"])
    return None


def _number(value: object) -> float | None:
    """A finite number of JSON, as a float; ``None`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- steps -----------------------------------------------------------------------------------

_ORDER = {"running": 0, "failed": 0, "timeout": 0, "skipped": 1}
"""Problems of a step, most important first: windows that failed or never ended, skipped
ones, failed rank captures (2), observed != requested (3), unreadable files (4), gated
requests without their capture (5)."""


def _step_report(
    root: Path,
    step: int,
    windows: list[WindowRecord],
    requests: _Requests,
    stages: dict[str, set[str]],
) -> StepReport:
    problems: list[tuple[int, str]] = []
    iterations: dict[str, Distribution] = {}
    stage_values: dict[str, array[float]] = {}
    drawn = requests.spans.pop(step, None) or _Earliest()
    order: dict[str, tuple[tuple[int, tuple[str, int], int], str]] = {}
    """Per row of ``drawn``: where it goes (a sort key) and its kind."""
    for window in windows:
        problems += _window_problems(window)
        if window.kind == "rollout":
            found = _iterations(root, window, problems)
            if found is not None:
                iterations[window.target] = distribution(found.durations)
                row = f"{window.target} · iterations"
                order[row] = ((2, _natural(window.target), 1), "iterations")
                drawn.add_many(row, found.items, found.placed)
        else:
            names = stages.get(window.target, set())
            for rank, path in _role_files(window):
                read = _read_or_note(root, path, problems, partial(_stages, names=names))
                if read is None:
                    continue
                values, ranges, placed = read
                for name, durations in values.items():
                    stage_values.setdefault(f"{window.target} · {name}", array("d")).extend(
                        durations
                    )
                row = window.target if rank is None else f"{window.target} · rank {rank}"
                order[row] = ((3, _natural(window.target), -1 if rank is None else rank), "ranges")
                drawn.add_many(row, ranges, placed)
    mine = requests.steps.pop(step, _StepRequests())
    waits, missing = _gated_waits(step, mine, requests.started_us)
    for target, count in sorted(missing.items()):
        problems.append(
            (5, f"{target}: {count} gated requests, but its capture's start is on no timeline")
        )
    problems.sort(key=lambda item: item[0])
    return StepReport(
        step=step,
        windows=tuple(_row(w) for w in windows),
        latency_captured=distribution(mine.captured),
        latency_uncaptured=distribution(mine.uncaptured),
        gated_wait=distribution(waits),
        iterations=iterations,
        stages={name: distribution(v) for name, v in sorted(stage_values.items())},
        problems=tuple(text for _, text in problems),
        timeline=_timeline(step, windows, requests.step_spans.pop(step, None), drawn, order),
    )


def _timeline(
    step: int,
    windows: list[WindowRecord],
    span: Interval | None,
    drawn: _Earliest,
    order: dict[str, tuple[tuple[int, tuple[str, int], int], str]],
) -> tuple[Row, ...]:
    """The step's rows, top to bottom: its span, its windows, per replica its requests and
    forward steps, per role and rank its ranges."""
    rows: list[Row] = []
    if span is not None:
        rows.append(Row(f"step {step}", (span,), "step"))
    for window in windows:
        begin, end = window.started_ns, window.stopped_ns
        if begin is not None and end is not None and 0 <= begin <= end < _MAX_NS:
            item = Interval(begin, end, f"{window.target} · step {step}", window.state)
            rows.append(Row(f"{window.target} · window", (item,), "window"))
    found = drawn.rows()
    for name in found:
        if name not in order:  # the timelines' rows: requests → replica_<r>
            order[name] = ((2, _natural(name.removeprefix("requests → ")), 0), "requests")
    for name in sorted(found, key=lambda n: order[n][0]):
        items, left_out = found[name]
        rows.append(Row(name, tuple(items), order[name][1], left_out))
    return tuple(rows)


def _natural(name: str) -> tuple[str, int]:
    """``replica_10`` after ``replica_9``."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return head, int(tail) if tail and len(tail) < 19 else -1


def _row(window: WindowRecord) -> WindowRow:
    return WindowRow(
        step=window.step,
        target=window.target,
        kind=window.kind,
        tool=window.tool,
        state=window.state,
        stop_reason=window.stop_reason,
        started_ns=window.started_ns,
        stopped_ns=window.stopped_ns,
        requested=window.forward_steps.requested,
        observed=window.forward_steps.observed,
        admitted=window.requests.admitted,
        gated=window.requests.gated,
        files=len(window.files),
        bytes=sum(f.bytes for f in window.files),
        error=window.error,
    )


def _window_problems(window: WindowRecord) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    target = window.target
    if window.state in _ORDER:
        what = "still running (the run ended without closing it)"
        if window.state != "running":
            what = window.state
        why = f": {window.error}" if window.error else ""
        found.append((_ORDER[window.state], f"{target}: {what}{why}"))
    for capture in window.captures:
        if capture.state == "failed":
            why = f": {capture.error}" if capture.error else ""
            found.append((2, f"{target} rank {capture.rank}: capture failed{why}"))
    fs = window.forward_steps
    if fs.requested is not None and fs.observed is not None and fs.observed != fs.requested:
        found.append(
            (3, f"{target}: {fs.observed} forward steps observed, {fs.requested} requested")
        )
    return found


def _traceable(path: str) -> bool:
    return path.endswith((".json", ".json.gz"))


def _role_files(window: WindowRecord) -> list[tuple[int | None, str]]:
    """The role window's traces, each with the rank that wrote it where the manifest says."""
    paths: dict[str, int | None] = {}
    for capture in window.captures:
        for f in capture.files:
            paths.setdefault(f.path, capture.rank)
    if not paths:
        paths = dict.fromkeys(f.path for f in window.files)
    return [(rank, path) for path, rank in paths.items() if _traceable(path)]


def _read_or_note(
    root: Path,
    path: str,
    problems: list[tuple[int, str]],
    take: Callable[[list[Any], int | None], _T],
) -> _T | None:
    """``take`` of the trace at ``path`` and of its time base (the wall-clock ns its ``ts`` 0
    stands for; ``None`` when it is on no known clock); ``None``, with a problem, when it
    cannot be read."""
    try:
        data = read_trace_below(root, path, MAX_INPUT_BYTES)
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError("not a Chrome trace: no traceEvents list")
        return take(events, _clock(data, events))
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


def _iterations(root: Path, window: WindowRecord, problems: list[tuple[int, str]]) -> _Found | None:
    """The window's iterations, from the trace holding the most; ``None`` when no trace
    holds any."""
    best: _Found | None = None
    for path in (f.path for f in window.files):
        if not _traceable(path):
            continue
        found = _read_or_note(root, path, problems, _iteration_durations)
        count = 0 if found is None else len(found.durations)
        if count > 0 and (best is None or count > len(best.durations)):
            best = found
    return best


def _clock(data: dict[str, Any], events: list[Any]) -> int | None:
    """The wall-clock ns a ``ts`` of 0 stands for in this trace (as ``aprof merge`` places
    it); ``None`` when it is on no known clock."""
    try:
        return time_base(data, [e for e in events if isinstance(e, dict)])
    except ValueError:
        return None


def _annotations(events: list[Any]) -> Iterable[tuple[str, float | None, float, dict[str, Any]]]:
    """The name, ``ts`` (µs; ``None`` when it is no number) and duration (µs) of each
    CPU-side ``record_function`` range of a trace, with the event."""
    for event in events:
        if (
            isinstance(event, dict)
            and event.get("ph") == "X"
            and event.get("cat") == "user_annotation"
            and isinstance(event.get("name"), str)
        ):
            dur = _number(event.get("dur"))
            if dur is not None and dur >= 0:
                yield event["name"], _number(event.get("ts")), dur, event


def _placed(base_ns: int | None, ts: float | None, dur: float, label: str) -> Interval | None:
    if base_ns is None or ts is None:
        return None
    return _interval(base_ns, ts, dur, label)


def _iteration_durations(events: list[Any], base_ns: int | None) -> _Found:
    by_dialect: dict[Dialect, _Found] = {}
    for name, ts, dur, _ in _annotations(events):
        dialect = iteration_dialect(name)
        if dialect is None:
            continue
        found = by_dialect.setdefault(dialect, _Found())
        found.durations.append(dur * _US)
        item = _placed(base_ns, ts, dur, name)
        if item is not None:
            found.items.append(item)
            found.placed += 1
            if len(found.items) >= 2 * TIMELINE_ITEMS:
                _earliest(found.items)
    for dialect in ("reference", "vllm", "sglang"):  # the reference server's holds vLLM's
        if dialect in by_dialect:
            found = by_dialect[dialect]
            _earliest(found.items)
            return found
    return _Found()


def _earliest(items: list[Interval]) -> None:
    items.sort(key=lambda item: item.begin_ns)
    del items[TIMELINE_ITEMS:]


def _stages(
    events: list[Any], base_ns: int | None, names: set[str]
) -> tuple[dict[str, list[float]], list[Interval], int]:
    """The durations (s) of each stage's ranges, and as intervals the stage ranges, else (none
    in this trace) the top-level ranges: the earliest ``TIMELINE_ITEMS``, and how many there
    were."""
    found: dict[str, list[float]] = {}
    ranges: list[Interval] = []
    top: list[tuple[object, float, float, str]] = []
    for name, ts, dur, event in _annotations(events):
        if name in names:
            found.setdefault(name, []).append(dur * _US)
            item = _placed(base_ns, ts, dur, name)
            if item is not None:
                ranges.append(item)
        elif ts is not None and base_ns is not None:
            top.append(((event.get("pid"), event.get("tid")), ts, dur, name))
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


def _stage_names(manifest: Manifest) -> dict[str, set[str]]:
    """Per role: the stages its discrete captures were of, anywhere in the run."""
    names: dict[str, set[str]] = {}
    for window in manifest.windows:
        for capture in window.captures:
            if capture.stage is not None:
                names.setdefault(window.target, set()).add(capture.stage)
    return names


def _gated_waits(
    step: int, mine: _StepRequests, started_us: dict[tuple[int, str], float]
) -> tuple[list[float], dict[str, int]]:
    waits: list[float] = []
    missing: dict[str, int] = {}
    for replica, begin in zip(mine.gated_replica, mine.gated_begin_us, strict=True):
        target = f"replica_{replica}"
        started = started_us.get((step, target))
        if started is None:
            missing[target] = missing.get(target, 0) + 1
        else:
            waits.append(max(0.0, (started - begin) * _US))
    return waits, missing
