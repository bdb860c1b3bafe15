"""The servers' own side of each step's requests: the spans the run's OTLP receiver filed
(``otel/step_<n>.spans.jsonl``), read back into queued, prefill and decode time, for the step
and for each replica, and, for the step's slowest requests, the gap between what the client
waited and what the server took (time on the network and in the client)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aprof._accounting import StepAccount
from aprof._otel import FOLDER, PHASES, Served, otel_folder, read_step, served, step_file
from aprof._timeline.recorder import span_id_of
from aprof._traces.files import unreadable


def server_sides(root: Path, accounts: Iterable[StepAccount]) -> tuple[dict[int, Any], list[str]]:
    """Per step with server spans, its ``server`` object for ``aprof report --json``; the
    problems met (a spans file that cannot be read costs its own step)."""
    found: dict[int, Any] = {}
    problems: list[str] = []
    try:
        with otel_folder(root) as folder:
            if folder is None:
                return found, problems
            for account in accounts:
                try:
                    spans = read_step(folder, account.step)
                except OSError as exc:
                    name = step_file(account.step)
                    problems.append(f"{FOLDER}/{name}: unreadable: {unreadable(exc)}")
                    continue
                if spans is not None:
                    found[account.step] = step_side(served(spans.spans)[0], account)
    except OSError as exc:
        problems.append(f"{FOLDER}/: unreadable: {unreadable(exc)}")
    return found, problems


def step_side(requests: dict[str, Served], account: StepAccount) -> dict[str, Any]:
    """One step's server side from its requests' server spans."""
    by_replica: dict[int, list[Served]] = {}
    for request in requests.values():
        if request.replica is not None:
            by_replica.setdefault(request.replica, []).append(request)
    slowest = []
    for slow in account.slowest:
        mine = requests.get(span_id_of(slow.request_id)) if slow.request_id else None
        entry: dict[str, Any] | None = None
        if mine is not None:
            entry = {**_times(mine), "gap_s": max(0.0, slow.latency_s - mine.e2e_s)}
        slowest.append({"request_id": slow.request_id, "server": entry})
    return {
        **_summaries(requests.values()),
        "replicas": [
            {"replica": replica, **_summaries(mine)} for replica, mine in sorted(by_replica.items())
        ],
        "slowest": slowest,
    }


def _times(request: Served) -> dict[str, float]:
    """One request's phases and time on the server (s), those its server gave."""
    times = {f"{phase}_s": request.seconds(phase) for phase in PHASES}
    found = {key: value for key, value in times.items() if value is not None}
    return {**found, "e2e_s": request.e2e_s}


def _summaries(requests: Iterable[Served]) -> dict[str, Any]:
    values: dict[str, list[float]] = {f"{phase}_s": [] for phase in (*PHASES, "e2e")}
    count = 0
    for request in requests:
        count += 1
        for key, value in _times(request).items():
            values[key].append(value)
    return {"spans": count, **{key: _summary(found) for key, found in values.items()}}


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
