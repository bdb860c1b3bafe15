"""The step on one clock: intervals on the wall clock (ns since the epoch), made from a file's
time base (ns) and a trace event's ``ts`` and ``dur`` (µs), and the earliest ``TIMELINE_ITEMS``
of them that a step keeps, with how many of each row were left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aprof._report.model import Interval

TIMELINE_ITEMS = 5000
"""The most requests, forward steps and ranges a step's ``timeline`` keeps (the earliest)."""
US = 1e-6
"""Seconds in a microsecond."""
MAX_NS = 1 << 62
"""Instants past this (the year 2116) or before the epoch are on no clock the report draws."""


class Earliest:
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


def interval(
    base_ns: int, ts_us: float, dur_us: float | None, label: str, state: str | None = None
) -> Interval | None:
    """An interval from a file's time base (ns), a ``ts`` and a duration (µs); ``None`` when
    the duration is no number or negative, or the interval is off the clock the report
    draws."""
    if dur_us is None or not dur_us >= 0 or abs(base_ns) >= MAX_NS:
        return None
    begin, end = ts_us * 1000, (ts_us + dur_us) * 1000
    if not (-MAX_NS < begin <= end < MAX_NS):  # also false for NaN and infinities
        return None
    begin_ns, end_ns = base_ns + round(begin), base_ns + round(end)
    if not 0 <= begin_ns <= end_ns < MAX_NS:
        return None
    return Interval(begin_ns, end_ns, label, state)


MAX_EXACT = 1 << 53
"""Integers below this in size are floats exactly."""


def number(value: object) -> float | None:
    """A finite number of JSON, as a float; ``None`` for anything else."""
    if type(value) is int and -MAX_EXACT < value < MAX_EXACT:
        return float(value)  # the common case, first: timestamps
    if type(value) is bool or not isinstance(value, (int, float)):  # a tuple: faster
        return None
    try:
        found = float(value)
    except OverflowError:
        return None
    return found if math.isfinite(found) else None
