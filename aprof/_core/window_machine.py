"""A window's life: its phases, the moves allowed between them, and the one object that moves it.

A (step, target) window is queued behind its target's previous stop, starting, active,
stopping, and then ended one way: done, failed, timed out or skipped. :data:`MOVES` is the
whole table; :class:`WindowRun` is the only writer of a window's phase, its manifest record's
state, stop reason and times, and its request counts, and it refuses a move the table does not
hold. What the manifest says (:func:`manifest_state`) and what other processes see
(:func:`shared_phase`) are read off the phase, never kept apart.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aprof._capture import CountSource, Window
from aprof._core.sharing import RemotePhase
from aprof._errors import WindowStateError
from aprof._manifest import (
    EnforcedBy,
    FileEntry,
    RankCapture,
    StopReason,
    Waited,
    WindowRecord,
    WindowState,
)
from aprof._timeline.recorder import Request, Tally


class Phase(enum.Enum):
    """Where one window stands; its value is the word the log, the timeline and (for the last
    four) the manifest use."""

    QUEUED = "queued"
    """Waiting for the target's previous stop to finish, or for the captures on the devices
    it shares (``colocation.py``); requests go ahead ungated."""
    STARTING = "starting"
    """The start is on its way; requests to its replica wait for it."""
    ACTIVE = "active"
    """The capture runs; requests to its replica are captured."""
    STOPPING = "stopping"
    """The stop is on its way; no request waits for it."""
    DONE = "done"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"
    """Never started: the step ended first, or no request reached its replica."""

    @property
    def final(self) -> bool:
        """The window has ended: nothing moves it again."""
        return not MOVES[self]


MOVES: Final[Mapping[Phase, frozenset[Phase]]] = {
    Phase.QUEUED: frozenset({Phase.STARTING, Phase.SKIPPED, Phase.FAILED, Phase.TIMEOUT}),
    Phase.STARTING: frozenset({Phase.ACTIVE, Phase.FAILED, Phase.TIMEOUT}),
    Phase.ACTIVE: frozenset({Phase.STOPPING, Phase.TIMEOUT}),
    Phase.STOPPING: frozenset({Phase.DONE, Phase.FAILED, Phase.TIMEOUT}),
    Phase.DONE: frozenset(),
    Phase.FAILED: frozenset(),
    Phase.TIMEOUT: frozenset(),
    Phase.SKIPPED: frozenset(),
}
"""Every move a window makes. From ``queued``: ``failed`` when the manifest cannot be written
(nothing is started then), ``skipped`` when the step ended before the previous stop did, or
a capture on the devices it shares did not stop;
``timeout`` from any phase not final: the profiler closed before the window ended."""

OnChange = Callable[["WindowRun", Phase, "str | None"], None]
"""Told ``(run, phase, detail)`` after every move of a window."""


def manifest_state(phase: Phase) -> WindowState:
    """The manifest's ``state`` of a window in ``phase``."""
    if phase is Phase.DONE:
        return "done"
    if phase is Phase.FAILED:
        return "failed"
    if phase is Phase.TIMEOUT:
        return "timeout"
    if phase is Phase.SKIPPED:
        return "skipped"
    return "running"


def shared_phase(run: WindowRun) -> RemotePhase:
    """Where ``run`` stands as other processes see it (``aprof.ray``)."""
    phase = run.phase
    if phase is Phase.QUEUED:
        return "queued"
    if phase is Phase.STARTING:
        return "starting"
    if phase is Phase.ACTIVE:
        return "active"
    # Requests that waited for a start that never became active were gated, not captured.
    sent = run.start_task is not None and run.record.started_ns is None
    return "failed" if sent else "ended"


@dataclass(frozen=True, slots=True)
class Captured:
    """What a stopped capture left, as the window records it."""

    files: Sequence[FileEntry]
    captures: Sequence[RankCapture]
    observed: int | None
    counted_from: CountSource | None


class WindowRun:
    """One (step, target) window in flight and its manifest record; the only writer of both.

    Its target's machine (``target_machine.py``) drives it through :meth:`begin_start`,
    :meth:`activate`, :meth:`begin_stop`, :meth:`end`; the profiler counts requests into it
    with :meth:`admit`. Every move is checked against :data:`MOVES` and told to ``on_change``.
    """

    __slots__ = (
        "_gated",
        "_on_change",
        "_phase",
        "_raised",
        "baseline",
        "last_count",
        "last_step",
        "poll_task",
        "record",
        "released",
        "start_task",
        "started",
        "stop_task",
        "tally",
        "window",
    )

    def __init__(self, window: Window, record: WindowRecord, on_change: OnChange) -> None:
        self.window = window
        self.record = record
        """The manifest's record of this window (read it; only this class writes it)."""
        self._on_change = on_change
        self._phase = Phase.QUEUED
        self.last_step = window.step
        """The last global step this window covers (continuous role windows grow)."""
        self.started = asyncio.Event()
        """Set when the start is over, whatever its outcome."""
        self.released = asyncio.Event()
        """Set once the target is free again: the stop call is over, or none was needed."""
        self.start_task: asyncio.Task[None] | None = None
        self.stop_task: asyncio.Task[None] | None = None
        self.poll_task: asyncio.Task[None] | None = None
        self.baseline: int | None = None
        """The forward-step counter when the capture became active."""
        self.last_count: int | None = None
        self._raised = False
        self.tally = Tally()
        """The requests admitted: counted here, or in C through the gate while active."""
        self._gated = 0

    @property
    def phase(self) -> Phase:
        """Where the window stands."""
        return self._phase

    @property
    def active(self) -> bool:
        """The capture is running and has not been asked to stop."""
        return self._phase is Phase.ACTIVE and self.stop_task is None

    # -- moves ---------------------------------------------------------------------------------

    def begin_start(self) -> None:
        """The start is sent now."""
        self._move(Phase.STARTING, None)

    def activate(self, enforced_by: EnforcedBy | None) -> None:
        """The start succeeded: the capture runs (bounded by ``enforced_by``, if bounded)."""
        self.record.started_ns = time.time_ns()
        if enforced_by is not None:
            self.record.forward_steps.enforced_by = enforced_by
        self._move(Phase.ACTIVE, None)

    def begin_stop(self) -> None:
        """The stop is sent now, for the reason asked first."""
        self._move(Phase.STOPPING, self.record.stop_reason)

    def end(
        self,
        phase: Phase,
        error: str | None = None,
        *,
        reason: StopReason | None = None,
        detail: str | None = None,
    ) -> None:
        """The window ends in ``phase`` (final) with ``error``; ``reason`` replaces the stop
        reason asked before; ``detail`` is told instead of ``error``."""
        if reason is not None:
            self.record.stop_reason = reason
        self.record.error = error
        if phase is not Phase.SKIPPED:
            self.record.stopped_ns = time.time_ns()
        self._move(phase, error if detail is None else detail)

    def _move(self, to: Phase, detail: str | None) -> None:
        if to not in MOVES[self._phase]:
            raise WindowStateError(
                f"step {self.window.step}, {self.window.target}: a window does not move "
                f"from {self._phase.value} to {to.value}"
            )
        self._phase = to
        self.record.state = manifest_state(to)
        self._on_change(self, to, detail)

    # -- what happens to it besides its moves --------------------------------------------------

    def ask_stop(self, reason: StopReason) -> None:
        """Record why the window is asked to stop, unless it was asked before."""
        if self.record.stop_reason is None:
            self.record.stop_reason = reason

    def stopped_itself(self) -> None:
        """The target had already ended the capture on its own."""
        self.record.stop_reason = "auto_stop"

    def unbounded(self) -> None:
        """Nothing bounds the window any more: it runs until its step ends."""
        self.record.forward_steps.enforced_by = "none"

    def record_result(self, result: Captured) -> None:
        """What the stopped capture left: its files, rank captures and forward steps seen."""
        record = self.record
        record.files = list(result.files)
        record.captures = list(result.captures)
        record.forward_steps.observed = result.observed
        record.forward_steps.counted_from = result.counted_from

    def waited(self, targets: list[str], seconds: float, why: str) -> None:
        """Its start waited ``seconds`` for the captures of ``targets`` (colocated)."""
        self.record.waited_for = Waited(targets=targets, seconds=round(seconds, 6), why=why)

    def extend_to(self, step: int) -> None:
        """A continuous window goes on through ``step``."""
        self.last_step = step

    def admit(self, req: Request) -> bool:
        """Count ``req`` if it comes while the window starts or runs (marking it gated or
        captured); True when it must wait for the start."""
        if self.active:
            self.tally.admitted += 1
            req.captured = True
        elif self._phase is Phase.STARTING:
            req.gated = True
            self._gated += 1
            self.tally.admitted += 1
            return True
        return False

    def add_counts(self, admitted: int, gated: int) -> None:
        """Requests another process counted into this window."""
        self.tally.admitted += admitted
        self._gated += gated

    def write_counts(self) -> None:
        """Bring the request counts into the manifest record (before it is written)."""
        counts = self.record.requests
        admitted = self.tally.admitted
        if (counts.admitted, counts.gated) != (admitted, self._gated):
            counts.admitted, counts.gated = admitted, self._gated

    def failure_to_raise(self) -> tuple[int, str, str] | None:
        """``(step, target, error)`` if the window failed and no caller was told yet
        (``strict: true``); telling it once."""
        if self._raised or self._phase not in (Phase.FAILED, Phase.TIMEOUT):
            return None
        self._raised = True
        return (self.window.step, self.window.target, self.record.error or self.record.state)


def add_counts(record: WindowRecord, admitted: int, gated: int) -> None:
    """Requests another process counted into an ended window whose record is still held."""
    counts = record.requests
    counts.admitted, counts.gated = counts.admitted + admitted, counts.gated + gated
