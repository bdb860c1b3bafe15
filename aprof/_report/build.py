"""What a run captured, step by step: the numbers behind ``aprof report``.

:func:`collect` reads a run back from its ``save_path``: the manifest (every window), every
timeline part it lists (aprof's request and capture spans) and the Chrome JSON traces of every
window (the servers' iterations, the trainer's stages). Each input is read below ``save_path``
without following a link, one at a time: a window's traces event by event, whatever their size
(``aprof._traces.stream``), a timeline part whole (at most ``MAX_INPUT_BYTES`` of JSON); one
that cannot be read is a problem line of the report, never an exception, and the rest is
reported.

- **Request latency**: each ``request`` span of a timeline (its ``b`` and ``e`` paired by
  ``id2.local``), end minus begin. Per profiled step, split by the span's ``captured`` flag;
  run-wide, the requests of profiled steps against those of the steps without a window, from
  the accounting's ledger (every step's latencies, or a uniform sample of a step's
  ``MAX_VALUES`` when it had more).
- **What is read**: where a process's timeline writer kept its ledgers beside the timeline
  (``ledgers.py``), only the writes of its timeline holding a profiled step's requests, span
  or capture start (a part not as its ledgers say: read whole); else every part.
- **Gated wait**: a gated request of replica ``r`` in step ``n`` waited from its begin until
  the ``starting`` slice of step ``n``'s ``capture replica_<r>`` span ended (the capture became
  active, or its start ended otherwise), at least 0. Placed by wall clock
  (``baseTimeNanoseconds`` + ``ts``): requests and captures may be on different processes'
  timelines.
- **Iterations**: per rollout window, the ``user_annotation`` ``X`` slices of its traces named as
  an engine names one iteration (``aprof._traces.iterations``: the reference server's
  ``forward_step#<k>``, which in its vLLM dialect holds vLLM's own annotation and so is taken
  alone when a trace has it; else vLLM's ``execute_..._context_...(`` or SGLang's ``step[``),
  from the trace that holds the most (each rank of a server writes the same iterations).
- **Stages**: per role window, the ``user_annotation`` ``X`` slices of every rank's traces named
  as a stage of that role (the stages of the role's discrete captures anywhere in the run: a
  stage range looks like any other ``record_function`` range, so a role captured only
  continuously has no stage durations).

- **One clock**: per profiled step, the intervals ``report.html`` draws as "Step <n> on one
  clock" (``StepReport.timeline``): the step's span, each window (an auto-stopped one up to
  its last forward step's end in its traces, where its capture ended: ``WindowRow.ended_ns``),
  each request span, each forward step of the trace its iterations come from, each trainer
  rank's stage ranges (else its top-level ``record_function`` ranges), all on the wall clock
  in ns, gathered while the inputs are read for the numbers above (no file is read twice). At
  most ``TIMELINE_ITEMS`` requests, forward steps and ranges per step, the earliest; each row
  counts those left out.

Percentiles are nearest-rank: the p-th of ``n`` sorted values is the ``ceil(p/100 * n)``-th,
always one of the values. Memory: the values of one profiled step are kept (8 bytes each, in
``array('d')``) until its report is made; the ledger keeps every step's latencies and ends (16
bytes a request, up to ``MAX_VALUES`` a step). The run-wide distributions keep their exact
count and a uniform sample of at most ``RUN_VALUES`` values, from which their percentiles and
sample come: exact up to ``RUN_VALUES`` requests, an estimate beyond (seeded, so the same run
gives the same report).
"""

from __future__ import annotations

import os
import random
from array import array
from collections import defaultdict
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from aprof._accounting import BASELINE, FACTOR, Ledger, StepAccount
from aprof._manifest import (
    HostClock,
    Manifest,
    TimelineFile,
    WindowRecord,
    load_manifest,
    split_notes,
)
from aprof._report import traces
from aprof._report.clock import MAX_NS, Earliest
from aprof._report.hosts import host_problems
from aprof._report.ledgers import Writes, read_writes, take_ledgers
from aprof._report.model import (
    Distribution,
    Interval,
    Row,
    RunReport,
    StepReport,
    WindowRow,
    distribution,
)
from aprof._report.requests import Requests, StepRequests, gated_waits
from aprof._report.server import server_sides
from aprof._traces.files import read_trace_below, unreadable

MAX_INPUT_BYTES = 2 << 30
"""The largest timeline part read whole (aprof writes its timeline in parts; a window's traces
are read event by event, whatever their size)."""
RUN_VALUES = 100_000
"""The most values the run-wide latency distributions keep for their percentiles."""
NO_TIMELINE = "no timeline in this run (timeline.enable: false?): no request latencies"
"""The note of a run without a timeline."""


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
    from aprof._report.html import write

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
    ledger = Ledger()
    requests = Requests(set(by_step), ledger)
    taken = take_ledgers(str(root), manifest, ledger, set(by_step))
    requests.accounted = taken.processes
    problems, notes = split_notes(manifest.notes)
    problems += _read_timelines(root, manifest, requests, skip=taken.accounted)
    problems += _read_writes(root, manifest, requests, taken.writes)
    stages = traces.stage_names(manifest)
    steps = tuple(_step_report(root, n, by_step[n], requests, stages) for n in sorted(by_step))
    for (step, target), when_us in requests.started_us.items():
        replica = target.removeprefix("replica_")
        if replica.isdigit() and len(replica) < 19:
            ledger.capture_started(step, int(replica), round(when_us * 1000))
    notes += taken.notes
    if not manifest.timeline:
        notes.append(NO_TIMELINE)
    profiled, unprofiled = _run_latencies(ledger, set(by_step))
    found = tuple(ledger.accounts(*_anomaly_rule(manifest)))
    server, unread = server_sides(root, found)
    return RunReport(
        run_id=manifest.run_id,
        save_path=root,
        steps=steps,
        latency_profiled=profiled,
        latency_unprofiled=unprofiled,
        problems=(*problems, *unread, *host_problems(manifest.hosts)),
        notes=tuple(notes),
        accounts=found,
        server=server,
        hosts=tuple(manifest.hosts),
    )


def _run_latencies(ledger: Ledger, profiled: set[int]) -> tuple[Distribution, Distribution]:
    """The latencies of the requests of the steps in ``profiled``, and of the others."""
    found = {True: (array("d"), [0]), False: (array("d"), [0])}
    for step, values, seen in ledger.latencies():
        kept, count = found[step in profiled]
        kept.extend(values)
        count[0] += seen
    distributions = []
    for kept, count in found.values():
        if len(kept) > RUN_VALUES:  # a uniform sample; seeded, so a run gives one report
            picked = random.Random(0).sample(range(len(kept)), RUN_VALUES)
            kept = array("d", (kept[i] for i in picked))
        distributions.append(distribution(kept, count[0]))
    return distributions[0], distributions[1]


def _anomaly_rule(manifest: Manifest) -> tuple[float, int]:
    """The run's ``triggers.slow_step`` factor and baseline, else the defaults."""
    triggers = manifest.config.get("triggers")
    slow = triggers.get("slow_step") if isinstance(triggers, dict) else None
    if not isinstance(slow, dict):
        return FACTOR, BASELINE
    factor, baseline = slow.get("factor"), slow.get("baseline_steps")
    return (
        factor if isinstance(factor, float | int) and factor > 0 else FACTOR,
        baseline if isinstance(baseline, int) and baseline > 0 else BASELINE,
    )


class Accounting(NamedTuple):
    """Every step's accounting of a run, with what a reader should know of it."""

    run_id: str
    save_path: Path
    accounts: tuple[StepAccount, ...]
    problems: tuple[str, ...]
    """Run-wide problems: the manifest's notes that are problems, timelines that cannot be
    read."""
    notes: tuple[str, ...]
    server: dict[int, Any] = {}  # noqa: RUF012 (a NamedTuple's default, never changed)
    """Per step with the servers' own spans, their side (:mod:`aprof._report.server`)."""
    hosts: tuple[HostClock, ...] = ()
    """Each host's clock against the driver's (a run over several Ray nodes)."""


def accounting(save_path: str | os.PathLike[str]) -> Accounting:
    """Where each step of the run in ``save_path`` went, with the run's problems and notes
    (``aprof status``, ``aprof report --json``): from the timeline writers' ledgers where they
    cover the listed timelines, else from the timelines alone (no capture trace is read:
    ``train_s`` is the stage spans'); a live run's as far as written.

    Raises ``ManifestError`` when ``save_path`` holds no readable manifest; a timeline that
    cannot be read costs its own spans.
    """
    root = Path(save_path)
    manifest = load_manifest(root)
    ledger = Ledger()
    taken = take_ledgers(str(root), manifest, ledger, set())
    requests = Requests(set(), ledger)
    requests.accounted = taken.processes
    problems, notes = split_notes(manifest.notes)
    notes += taken.notes
    problems += _read_timelines(root, manifest, requests, skip=taken.accounted)
    if not manifest.timeline:
        notes.append(NO_TIMELINE)
    found = tuple(ledger.accounts(*_anomaly_rule(manifest)))
    server, unread = server_sides(root, found)
    return Accounting(
        run_id=manifest.run_id,
        save_path=root,
        accounts=found,
        problems=(*problems, *unread, *host_problems(manifest.hosts)),
        notes=tuple(notes),
        server=server,
        hosts=tuple(manifest.hosts),
    )


def _read_timelines(
    root: Path, manifest: Manifest, requests: Requests, *, skip: set[str]
) -> list[str]:
    """Every timeline part of the run into ``requests``, one at a time, but the files in
    ``skip``; the problems met."""
    problems = []
    for entry in manifest.timeline:
        if entry.dropped > 0:
            problems.append(
                f"{entry.path}: {entry.dropped} timeline events dropped "
                "(raise timeline.buffer_events)"
            )
        if entry.path not in skip:
            problems += _read_timeline(root, entry, requests)
    return problems


def _read_timeline(root: Path, entry: TimelineFile, requests: Requests) -> list[str]:
    try:  # passed on, not kept: one input in memory at a time
        data = read_trace_below(root, entry.path, MAX_INPUT_BYTES)
        requests.add_file(data, entry.process)
    except Exception as exc:  # a damaged timeline costs its own spans only
        return [f"{entry.path}: timeline unreadable: {unreadable(exc)}"]
    return []


def _read_writes(
    root: Path, manifest: Manifest, requests: Requests, writes: list[Writes]
) -> list[str]:
    """The writes of the accounted timelines that hold a profiled step into ``requests``,
    one part at a time; a part whose writes are not where its ledgers say is read whole."""
    problems = []
    entries = {entry.path: entry for entry in manifest.timeline}
    for found in writes:
        entry = entries[found.path]
        try:
            requests.add_file(read_writes(str(root), found, MAX_INPUT_BYTES), entry.process)
        except Exception:  # the part changed since: its own JSON says what it holds
            problems += _read_timeline(root, entry, requests)
    return problems


# -- steps -----------------------------------------------------------------------------------

_ORDER = {"running": 0, "failed": 0, "timeout": 0, "skipped": 1}
"""Problems of a step, most important first: windows that failed or never ended, skipped
ones, failed rank captures (2), observed != requested (3), unreadable files (4), gated
requests without their capture (5)."""


def _step_report(
    root: Path,
    step: int,
    windows: list[WindowRecord],
    requests: Requests,
    stages: dict[str, set[str]],
) -> StepReport:
    problems: list[tuple[int, str]] = []
    iterations: dict[str, Distribution] = {}
    stage_values: dict[str, array[float]] = {}
    ended: dict[str, int] = {}
    """Per auto-stopped rollout target: when its capture ended (``_capture_ended``)."""
    drawn = requests.spans.pop(step, None) or Earliest()
    order: dict[str, tuple[tuple[int, tuple[str, int], int], str]] = {}
    """Per row of ``drawn``: where it goes (a sort key) and its kind."""
    for window in windows:
        problems += _window_problems(window)
        if window.kind == "rollout":
            found = traces.iterations(root, window, problems)
            if found is not None:
                iterations[window.target] = distribution(found.durations)
                end = _capture_ended(window, found.last_end_ns)
                if end is not None:
                    ended[window.target] = end
                row = f"{window.target} · iterations"
                order[row] = ((2, _natural(window.target), 1), "iterations")
                drawn.add_many(row, found.items, found.placed)
        else:
            names = stages.get(window.target, set())
            for rank, path in traces.role_files(window):
                read = traces.read_or_note(
                    root, path, problems, partial(traces.stages, names=names)
                )
                if read is None:
                    continue
                values, ranges, placed = read
                if names:  # stage ranges (else top-level ranges, which are no stages)
                    for item in ranges:
                        requests.ledger.stage(item.begin_ns, item.end_ns)
                for name, durations in values.items():
                    stage_values.setdefault(f"{window.target} · {name}", array("d")).extend(
                        durations
                    )
                row = window.target if rank is None else f"{window.target} · rank {rank}"
                order[row] = ((3, _natural(window.target), -1 if rank is None else rank), "ranges")
                drawn.add_many(row, ranges, placed)
    mine = requests.steps.pop(step, StepRequests())
    waits, missing = gated_waits(step, mine, requests.started_us)
    for target, count in sorted(missing.items()):
        problems.append(
            (5, f"{target}: {count} gated requests, but its capture's start is on no timeline")
        )
    problems.sort(key=lambda item: item[0])
    return StepReport(
        step=step,
        windows=tuple(_row(w, ended.get(w.target)) for w in windows),
        latency_captured=distribution(mine.captured),
        latency_uncaptured=distribution(mine.uncaptured),
        gated_wait=distribution(waits),
        iterations=iterations,
        stages={name: distribution(v) for name, v in sorted(stage_values.items())},
        problems=tuple(text for _, text in problems),
        timeline=_timeline(step, windows, ended, requests.step_spans.pop(step, None), drawn, order),
    )


def _capture_ended(window: WindowRecord, last_forward_ns: int | None) -> int | None:
    """When an auto-stopped window's capture ended: its last forward step's end (the server,
    or aprof's counter poll, stopped it after that step, before aprof recorded the stop);
    ``None`` for another window, or when that end lies outside the window's start and stop
    (a trace on a clock that disagrees)."""
    begin, stopped = window.started_ns, window.stopped_ns
    if window.stop_reason != "auto_stop" or last_forward_ns is None:
        return None
    if begin is None or stopped is None or not begin <= last_forward_ns <= stopped:
        return None
    return last_forward_ns


def _timeline(
    step: int,
    windows: list[WindowRecord],
    ended: dict[str, int],
    span: Interval | None,
    drawn: Earliest,
    order: dict[str, tuple[tuple[int, tuple[str, int], int], str]],
) -> tuple[Row, ...]:
    """The step's rows, top to bottom: its span, its windows (each to where its capture
    ended), per replica its requests and forward steps, per role and rank its ranges."""
    rows: list[Row] = []
    if span is not None:
        rows.append(Row(f"step {step}", (span,), "step"))
    for window in windows:
        begin, end = window.started_ns, ended.get(window.target, window.stopped_ns)
        if begin is not None and end is not None and 0 <= begin <= end < MAX_NS:
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


def _row(window: WindowRecord, ended_ns: int | None) -> WindowRow:
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
        ended_ns=ended_ns,
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
