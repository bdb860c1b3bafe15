"""What a profiler shares with other processes, transport aside (``aprof.ray`` carries it).

The driver's :class:`~aprof.Profiler` stays the one owner of every window. Other processes
see its :class:`RolloutView` (the step now open and where each replica's window of that step
stands), ask it to open a window that is due, and report what they counted. A
:class:`Link` is the driver's side of such a transport: the profiler tells it when the view
changed and waits for it as a step begins (``serving.py`` is what it calls back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

RemotePhase = Literal["due", "queued", "starting", "active", "ended", "failed"]
"""Where a replica's window of the open step stands, as other processes see it.

``due``: not opened yet, the step's first request to the replica opens it; ``queued``: waiting
for the target's previous stop (requests go ungated, as in one process); ``starting``: requests
wait for the start; ``active``: requests are captured; ``ended``: stopping or stopped, requests
go uncounted; ``failed``: the start failed, requests that waited for it are counted as gated.
A replica without a window in this step is absent.
"""


class RolloutView(NamedTuple):
    """The driver's open step as other processes see it (plain values: it crosses processes)."""

    version: int
    """Grows with every change; a process keeps the newest it has seen."""
    step: int | None
    live: bool
    """The step has rollout windows: requests are admitted."""
    phases: dict[int, RemotePhase]
    closing: bool = False
    """The driver's profiler closes: each process closes its remote profiler now."""


class Counts(NamedTuple):
    """What one process counted for one (step, replica) window since its last report."""

    step: int
    replica: int
    admitted: int
    gated: int
    ungated: int
    """Requests that went ahead unadmitted because the driver did not answer in time."""


@dataclass
class Report:
    """What one process tells the driver: its counts and its timeline's files."""

    counts: list[Counts] = field(default_factory=list)
    timeline: list[dict[str, object]] = field(default_factory=list)
    """Its timeline files, as manifest ``TimelineFile`` fields."""
    closed: bool = False
    """The process closed its profiler: it reports nothing more."""
    ledger: Any = None
    """Its timeline writes' ledger since its last report (``aprof._accounting.Ledger.take``'s
    plain data), for the driver's accounting of the latest steps."""


class Link(Protocol):
    """The driver's side of a transport to other processes (``aprof.ray.share``)."""

    def changed(self) -> None:
        """The profiler's :class:`RolloutView` changed: tell the other processes (no wait)."""

    async def entered(self, step: int) -> None:
        """Step ``step`` is open: return once the other processes know it (bounded)."""

    async def aclose(self) -> None:
        """The profiler closes: have the other processes close, take their last reports in
        and stop (bounded)."""

    async def last_word(self) -> None:
        """The profiler's own files are written: list (or collect) the run's files on every
        host and measure the clocks a last time (bounded), for the manifest."""
