"""What a report holds: a run's profiled steps, each with its windows, its distributions of
request latency, gated wait, server iteration and trainer stage durations, its problems and its
picture on one clock, as frozen values; and :func:`distribution`, which makes a distribution.

:func:`aprof._report.build` fills them (how each number is taken is told there);
``text.py`` and ``html.py`` show them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aprof._accounting import StepAccount
from aprof._manifest import HostClock

SAMPLE = 2000
"""The most values a ``Distribution.sample`` holds."""


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
    ended_ns: int | None = None
    """When its capture ended, where that is known apart from ``stopped_ns`` (when aprof
    recorded the stop): an auto-stopped rollout window's last forward step's end in its
    traces, as the server stopped capturing there."""

    @property
    def capture_end_ns(self) -> int | None:
        """When its capture ended: ``ended_ns``, else ``stopped_ns``."""
        return self.stopped_ns if self.ended_ns is None else self.ended_ns


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
    """Run-wide: the manifest's notes that are problems (``Note.level``), dropped timeline
    events, unreadable timelines."""
    notes: tuple[str, ...] = field(default=())
    """Things to know that are not problems: the manifest's other notes, ledgers not used."""
    html: Path | None = None
    """Where :func:`report` wrote the HTML report; ``None`` from :func:`collect`."""
    accounts: tuple[StepAccount, ...] = ()
    """Every step with a span on the driver's timeline, profiled or not: where its time
    went (:mod:`aprof._accounting`)."""
    server: dict[int, Any] = field(default_factory=dict)
    """Per step with the servers' own spans, their side (:mod:`aprof._report.server`)."""
    hosts: tuple[HostClock, ...] = ()
    """Each host's clock against the driver's (a run over several Ray nodes)."""


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
