"""The hub: a Ray actor that stands between the driver's profiler and the other processes.

A Ray driver cannot be called by its actors, so the driver keeps a small async actor, the
hub, on its node. The driver publishes its :class:`RolloutView` to the hub and long-polls it
for mail (first requests that open a window, the processes' reports, their calls); every
other process long-polls it for the view, handing in its report with each poll, asks it for
the outcome of a window that is due or starting, and hands it calls (capture requests, targets
added or removed), which wait there for the driver's decision. When the driver's profiler
closes, its last view says so (``closing``): each process closes itself, and the driver waits
for them (bounded).
Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from aprof._accounting import combined
from aprof._core.accounting import KEEP
from aprof._core.sharing import Counts, Report, RolloutView

Answer = Literal["active", "started", "failed", "go"]
"""What a request learns by asking: the window was active; it was due or starting and is now
active (the request was gated); its start failed (gated, not captured); or the request goes
uncounted (no window, queued, or the step is over)."""

WATCH_S: Final = 10.0
"""A process's watch returns after this long without news: its report flows at least this
often, and a hub that is gone is noticed within it."""
MAX_CALLS: Final = 10_000
"""Calls the hub serves at once: one watch per process, one ask per (process, replica), one
per call (a capture request, a target change) waiting for the driver."""


CallOp = Literal["capture", "add_target", "remove_target"]


class Call(NamedTuple):
    """What another process asks the driver's profiler to do: ``capture`` (the request's
    fields), ``add_target`` (the target, pickled) or ``remove_target`` (its name)."""

    op: CallOp
    payload: Any


class Decision(NamedTuple):
    """The driver's word on one call another process handed the hub: exactly one field is
    set (plain values: it crosses processes)."""

    answer: dict[str, object] | None = None
    """The driver did it: a capture's ``CaptureAnswer`` JSON fields (accepted or refused),
    empty for a target change."""
    malformed: tuple[str | None, str] | None = None
    """The driver found the capture request malformed: its ``ConfigError``'s key and reason."""
    refused: str | None = None
    """The driver refused the target change: its ``TargetError``'s message."""
    error: str | None = None
    """No decision: why (the driver closes, failed, or did not answer in time)."""


@dataclass
class Mail:
    """What waits for the driver: asks that open a window, reports, calls."""

    number: int
    """The hub's number for it: the driver's next pull says the last it took, and the hub
    keeps each until then."""
    asks: list[tuple[int, int]] = field(default_factory=list)
    reports: dict[str, Report] = field(default_factory=dict)
    calls: dict[int, Call] = field(default_factory=dict)
    """Calls, by the hub's number for each: answered by number."""


@dataclass
class _Process:
    seen: int = -1
    """The newest view version the process has applied."""
    watching: bool = False
    lagging: bool = False
    """It did not take a step in time: steps do not wait for it until it catches up."""
    closed: bool = False


class Hub:
    """The hub's state and calls (the Ray actor wraps this class)."""

    def __init__(self, *, start_s: float, connect_s: float) -> None:
        self._start_s = start_s
        self._connect_s = connect_s
        self._view = RolloutView(0, None, False, {})
        self._news = asyncio.Condition()
        """Notified when the view changes or a process has seen a newer one."""
        self._mail = asyncio.Condition()
        """Notified when an ask or a report waits for the driver."""
        self._processes: dict[str, _Process] = {}
        self._asks: set[tuple[int, int]] = set()
        self._reports: dict[str, Report] = {}
        self._calls: dict[int, Call] = {}
        """Calls the driver has not pulled yet."""
        self._outbox: dict[int, Mail] = {}
        """Mail handed out that the driver has not said it took, by number."""
        self._mail_numbers = itertools.count(1)
        self._deciding: dict[int, asyncio.Future[Decision]] = {}
        """The calls waiting for the driver's decision, pulled or not."""
        self._numbers = itertools.count(1)
        self._woken = False

    # -- the driver's calls -------------------------------------------------------------------

    async def publish(self, view: RolloutView) -> None:
        """Take the driver's view, unless a newer one came first."""
        if view.version > self._view.version:
            self._view = view
            async with self._news:
                self._news.notify_all()

    async def entered(self, view: RolloutView) -> list[str]:
        """Take ``view`` (a step's first), then wait (at most ``connect_s``) until every
        process that joined has seen it; returns those that did not, which steps no longer
        wait for."""
        # The view comes along as Ray may run this call before the publish sent ahead of
        # it: a process joining in between would be handed the view before the step.
        await self.publish(view)
        version = view.version

        def behind() -> list[str]:
            return [
                name
                for name, p in self._processes.items()
                if not p.lagging and not p.closed and p.seen < version
            ]

        try:
            async with asyncio.timeout(self._connect_s), self._news:
                await self._news.wait_for(lambda: not behind())
            return []
        except TimeoutError:
            late = behind()
            for name in late:
                self._processes[name].lagging = True
            return late

    async def pull(self, wait_s: float, taken: int) -> list[Mail]:
        """The mail the driver has not taken, oldest first: every one numbered above
        ``taken``, the last it took (waiting up to ``wait_s`` for some).

        Mail stays here until a later pull says it was taken: Ray runs a call whose caller
        stopped waiting (a pull the driver gave up on, as the hub started late, or cancelled
        as it closed), and the mail that call takes would otherwise reach nobody."""
        for number in [n for n in self._outbox if n <= taken]:
            del self._outbox[number]

        def waiting() -> bool:
            return bool(self._outbox or self._asks or self._reports or self._calls or self._woken)

        try:
            async with asyncio.timeout(wait_s), self._mail:
                await self._mail.wait_for(waiting)
        except TimeoutError:
            pass
        self._woken = False
        if self._asks or self._reports or self._calls:
            number = next(self._mail_numbers)
            self._outbox[number] = Mail(number, sorted(self._asks), self._reports, self._calls)
            self._asks, self._reports, self._calls = set(), {}, {}
        return list(self._outbox.values())

    async def decided(self, decisions: dict[int, Decision]) -> None:
        """The driver's decisions on the calls it pulled, by number: each goes to the process
        waiting for it (one that gave up meanwhile is gone)."""
        for number, decision in decisions.items():
            waiting = self._deciding.get(number)
            if waiting is not None and not waiting.done():
                waiting.set_result(decision)

    async def closed(self, wait_s: float) -> list[str]:
        """Wait (at most ``wait_s``) until every process that watches and keeps up has
        closed; returns those that did not. Those that never watched or lag are not waited
        for: they may not hear that the run closes."""

        def still_open() -> list[str]:
            return [
                name
                for name, p in self._processes.items()
                if p.watching and not p.lagging and not p.closed
            ]

        try:
            async with asyncio.timeout(wait_s), self._news:
                await self._news.wait_for(lambda: not still_open())
            return []
        except TimeoutError:
            return still_open()

    async def wake(self) -> None:
        """Have the driver's pull in flight return now (the driver is closing)."""
        self._woken = True
        async with self._mail:
            self._mail.notify_all()

    def processes(self) -> dict[str, str]:
        """Each process and where it stands: ``closed``, ``lagging``, ``watching`` or
        ``registered`` (it never watched)."""
        return {
            name: "closed"
            if p.closed
            else "lagging"
            if p.lagging
            else "watching"
            if p.watching
            else "registered"
            for name, p in self._processes.items()
        }

    # -- the other processes' calls -------------------------------------------------------------

    def register(self, role: str, rank: int | None) -> tuple[str, RolloutView]:
        """A process joins: its unique name (``<role>_<rank>``, the next free rank if none is
        given, with ``-2``, ``-3``… for a name taken before) and the view now."""
        if rank is None:
            rank = 0
            while f"{role}_{rank}" in self._processes:
                rank += 1
        name = base = f"{role}_{rank}"
        again = 1
        while name in self._processes:
            again += 1
            name = f"{base}-{again}"
        self._processes[name] = _Process(seen=self._view.version)
        return name, self._view

    async def watch(self, name: str, seen: int, report: Report | None) -> RolloutView:
        """Hand in ``report``; returns the view once it is newer than ``seen`` (at most
        ``WATCH_S`` later)."""
        process = self._processes.setdefault(name, _Process())
        process.watching = True
        if report is not None:
            await self._file(name, report)
        if seen > process.seen:
            process.seen = seen
            if seen >= self._view.version:
                process.lagging = False
            async with self._news:
                self._news.notify_all()
        try:
            async with asyncio.timeout(WATCH_S), self._news:
                await self._news.wait_for(lambda: self._view.version > seen)
        except TimeoutError:
            pass
        return self._view

    async def ask(self, step: int, replica: int) -> tuple[Answer, int]:
        """The outcome for a request of ``step`` to ``replica`` whose window is due or
        starting, and the version of the view it was read from: waits while the window is
        due or starting (at most ``start_s`` and ``connect_s``)."""
        arrival = self._phase(step, replica)
        if arrival not in ("due", "starting"):
            return ("active" if arrival == "active" else "go"), self._view.version
        if arrival == "due":
            self._asks.add((step, replica))
            async with self._mail:
                self._mail.notify_all()
        saw_start = arrival == "starting"

        def settled() -> bool:
            nonlocal saw_start
            phase = self._phase(step, replica)
            saw_start = saw_start or phase == "starting"
            return phase not in ("due", "starting")

        try:
            async with asyncio.timeout(self._start_s + self._connect_s), self._news:
                await self._news.wait_for(settled)
        except TimeoutError:
            pass
        final, version = self._phase(step, replica), self._view.version
        if final in ("active", "ended"):
            return "started", version
        return ("failed" if saw_start or final == "failed" else "go"), version

    async def call(self, call: Call) -> Decision:
        """``call``, for the driver to carry out: its decision, once it comes (at most
        ``connect_s`` later). A call the driver has not pulled by then is withdrawn (never
        carried out); one it pulled may still be."""
        if self._view.closing:
            return Decision(error="the driver's profiler is closing")
        number = next(self._numbers)
        decision: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._deciding[number] = decision
        self._calls[number] = call
        try:
            async with self._mail:
                self._mail.notify_all()
            async with asyncio.timeout(self._connect_s):
                return await decision
        except TimeoutError:
            if self._calls.pop(number, None) is not None:
                return Decision(
                    error="the driver did not take it within timeouts.connect_s; it was "
                    "withdrawn, not carried out"
                )
            return Decision(
                error="the driver took it and did not answer within timeouts.connect_s; it "
                "may still be carried out"
            )
        finally:
            self._calls.pop(number, None)  # a caller cancelled withdraws it too
            self._deciding.pop(number, None)

    async def close(self, name: str, report: Report) -> None:
        """The process's last report: it closed its remote profiler."""
        self._processes.setdefault(name, _Process()).closed = True
        report.closed = True
        await self._file(name, report)
        async with self._news:  # the driver's close may wait for it
            self._news.notify_all()

    # -- helpers --------------------------------------------------------------------------------

    def _phase(self, step: int, replica: int) -> str | None:
        view = self._view
        return view.phases.get(replica) if view.step == step else None

    async def _file(self, name: str, report: Report) -> None:
        """Keep ``report`` for the driver, summed with what is still waiting from ``name``."""
        if not (report.counts or report.timeline or report.closed or report.ledger):
            return
        waiting = self._reports.get(name)
        if waiting is None:
            self._reports[name] = report
        else:
            sums: dict[tuple[int, int], list[int]] = {}
            for c in (*waiting.counts, *report.counts):
                total = sums.setdefault((c.step, c.replica), [0, 0, 0])
                total[0] += c.admitted
                total[1] += c.gated
                total[2] += c.ungated
            waiting.counts = [Counts(s, r, *t) for (s, r), t in sums.items()]
            waiting.timeline = report.timeline or waiting.timeline
            waiting.closed = waiting.closed or report.closed
            if report.ledger:
                try:
                    waiting.ledger = combined(waiting.ledger, report.ledger, KEEP)
                except Exception:  # not a ledger: the driver says so as it merges it
                    waiting.ledger = report.ledger
        async with self._mail:
            self._mail.notify_all()
