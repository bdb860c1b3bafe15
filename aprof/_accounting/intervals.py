"""Intervals on one clock (ns): unions kept as sorted disjoint intervals, how much of a span
they cover, nearest-rank percentiles and a rolling median. Standard library only."""

from __future__ import annotations

import base64
import bisect
import heapq
import math
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any


class Union:
    """A union of intervals (ns), kept as sorted disjoint intervals; new ones are merged in by
    :meth:`settle`."""

    __slots__ = ("_begins", "_ends", "_new")

    def __init__(self) -> None:
        self._begins = array("q")
        self._ends = array("q")
        self._new: list[tuple[int, int]] = []

    def add(self, begin: int, end: int) -> None:
        if end > begin:
            self._new.append((begin, end))

    def settle(self) -> None:
        """Merge what :meth:`add` took into the disjoint intervals."""
        if not self._new:
            return
        merged = heapq.merge(zip(self._begins, self._ends, strict=True), sorted(self._new))
        begins, ends = array("q"), array("q")
        for begin, end in merged:
            if ends and begin <= ends[-1]:
                if end > ends[-1]:
                    ends[-1] = end
            else:
                begins.append(begin)
                ends.append(end)
        self._begins, self._ends, self._new = begins, ends, []

    def tidy(self) -> None:
        """:meth:`settle` once the intervals not merged yet outnumber the merged ones (and
        4,096): memory stays near the union's, and the cost of merging amortized."""
        if len(self._new) > max(4096, len(self._begins)):
            self.settle()

    def intervals(self) -> Iterator[tuple[int, int]]:
        return zip(self._begins, self._ends, strict=True)

    def plain(self) -> tuple[str, str]:
        """The settled intervals as two arrays, :func:`packed` (for ``Ledger.take``)."""
        self.settle()
        return packed(self._begins), packed(self._ends)

    def extend(self, found: Iterable[tuple[int, int]]) -> None:
        """Take in intervals (merged at the next :meth:`settle`)."""
        self._new.extend(found)

    def forget_before(self, when: int) -> None:
        """Drop the intervals that ended before ``when``."""
        self.settle()
        i = bisect.bisect_left(self._ends, when)
        del self._begins[:i], self._ends[:i]

    def covered(self, begin: int, end: int) -> int:
        """How much of ``[begin, end]`` the union covers, in ns (after :meth:`settle`)."""
        begins, ends = self._begins, self._ends
        i = max(0, bisect.bisect_right(begins, begin) - 1)
        total = 0
        while i < len(begins) and begins[i] < end:
            total += max(0, min(ends[i], end) - max(begins[i], begin))
            i += 1
        return total

    def __and__(self, other: Union) -> Union:
        """Where both unions cover (both settled)."""
        both = Union()
        a, b = list(self.intervals()), list(other.intervals())
        i = j = 0
        while i < len(a) and j < len(b):
            begin, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if begin < end:
                both._begins.append(begin)
                both._ends.append(end)
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return both

    def __len__(self) -> int:
        return len(self._begins) + len(self._new)


def packed(values: array[Any]) -> str:
    """An array's bytes (this machine's byte order) as base64 text."""
    return base64.b64encode(values.tobytes()).decode("ascii")


def unpack(into: array[Any], text: object) -> None:
    """Append :func:`packed`'s ``text`` to ``into``; raises ``ValueError`` (or ``TypeError``)
    on anything else."""
    if not isinstance(text, str):
        raise TypeError(f"packed values are text, not {type(text).__name__}")
    into.frombytes(base64.b64decode(text, validate=True))


def intervals(plain: Any) -> list[tuple[int, int]]:
    """:meth:`Union.plain`'s intervals, those not empty; raises ``ValueError`` (or
    ``TypeError``) on anything else."""
    begins, ends = array("q"), array("q")
    first, second = plain
    unpack(begins, first)
    unpack(ends, second)
    if len(begins) != len(ends):
        raise ValueError("a union's begins and ends differ in number")
    return [(b, e) for b, e in zip(begins, ends, strict=True) if e > b]


def nearest_rank(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile of ``ordered`` (sorted, not empty), nearest rank."""
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class RollingMedian:
    """The median of the last ``size`` values added (a bisect insert and remove per value: the
    cost stays flat on a long run)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._recent)

    def median(self) -> float | None:
        values = self._sorted
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    def add(self, value: float) -> None:
        self._recent.append(value)
        bisect.insort(self._sorted, value)
        if len(self._recent) > self.size:
            old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
