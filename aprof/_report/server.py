"""The servers' own side of each step's requests: the spans the run's OTLP receiver filed
(``otel/step_<n>.spans.jsonl``), read back into queued, prefill and decode time, and, for the
step's slowest requests, the gap between what the client waited and what the server took
(time on the network and in the client)."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from aprof._accounting import StepAccount
from aprof._otel import FOLDER, LATENCIES
from aprof._safe_files import open_folder, read_regular
from aprof._timeline.recorder import span_id_of
from aprof._trace_json import unreadable

MAX_FILE_BYTES: Final = 1 << 30
"""A step's spans file read at most (the receiver keeps ``otel.max_spans_per_step`` lines)."""
PHASES: Final = {f"{phase}_s": attribute for phase, attribute in LATENCIES.items()}
"""Each server-side time as the report names it, and the span attribute that gives it."""


def server_sides(root: Path, accounts: Iterable[StepAccount]) -> tuple[dict[int, Any], list[str]]:
    """Per step with server spans, its ``server`` object for ``aprof report --json``; the
    problems met (a spans file that cannot be read costs its own step)."""
    try:
        folder = open_folder(str(root), (FOLDER,), create=False)
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{FOLDER}/: unreadable: {unreadable(exc)}"]
    found: dict[int, Any] = {}
    problems: list[str] = []
    try:
        names = set(os.listdir(folder))
        for account in accounts:
            name = f"step_{account.step}.spans.jsonl"
            if name not in names:
                continue
            try:
                data = read_regular(name, MAX_FILE_BYTES, dir_fd=folder)
            except OSError as exc:
                problems.append(f"{FOLDER}/{name}: unreadable: {unreadable(exc)}")
                continue
            found[account.step] = _side(data, account)
    finally:
        os.close(folder)
    return found, problems


def _side(data: bytes, account: StepAccount) -> dict[str, Any]:
    """One step's server side from its spans file's bytes."""
    times: dict[str, list[float]] = {key: [] for key in PHASES}
    by_parent: dict[str, dict[str, float]] = {}
    spans = 0
    for line in data.splitlines():
        try:
            span = json.loads(line)
        except ValueError:
            continue
        attributes = span.get("attributes") if isinstance(span, dict) else None
        if not isinstance(attributes, dict):
            continue
        mine = _times(attributes)
        if not mine:
            continue  # not a server's span of a request
        spans += 1
        for key, value in mine.items():
            times[key].append(value)
        parent = span.get("parent_span_id")
        if isinstance(parent, str):
            by_parent[parent] = mine
    slowest = []
    for slow in account.slowest:
        served = by_parent.get(span_id_of(slow.request_id)) if slow.request_id else None
        entry: dict[str, Any] | None = None
        if served is not None:
            entry = dict(served)
            e2e = served.get("e2e_s")
            entry["gap_s"] = None if e2e is None else max(0.0, slow.latency_s - e2e)
        slowest.append({"request_id": slow.request_id, "server": entry})
    return {
        "spans": spans,
        **{key: _summary(values) for key, values in times.items()},
        "slowest": slowest,
    }


def _times(attributes: Mapping[str, Any]) -> dict[str, float]:
    found = {}
    for key, attribute in PHASES.items():
        value = attributes.get(attribute)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            found[key] = float(value)
    return found


def _summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values.sort()
    return {
        "p50": statistics.median(values),
        "p99": values[min(len(values) - 1, round(0.99 * (len(values) - 1)))],
        "max": values[-1],
        "sum": sum(values),
    }
