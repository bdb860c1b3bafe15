"""The timeline: spans as events in a bounded buffer, written off the event loop.

A span is recorded once, when it ends, as one event holding its begin and end (monotonic ns).
Spans and requests, the hot path, record themselves into the timeline's ``Recorder``
(``recorder.py``), which holds events in marshal's format; steps and windows come through
:meth:`Timeline.add`. The timeline takes at most ``buffer_events`` events between two
writes of its file, and what does not fit is dropped and counted. Every ``_BATCH`` events, and
at each flush, a writer thread per timeline hands them to the interpreter's writer process
(``writer_process.py``), which turns them into Chrome trace JSON and gzip
(``chrome_trace.py``) and writes the file at each flush; where that process cannot
start, the thread does it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from aprof._accounting import Ledger
from aprof._logging import logger
from aprof._timeline.chrome_trace import Anchor, ChromeTraceWriter, Written, part_name
from aprof._timeline.events import STEP, WINDOW, Event, now_ns
from aprof._timeline.recorder import Recorder
from aprof._timeline.writer_process import RemoteFile, WriterProcess

if TYPE_CHECKING:
    from aprof._manifest import WindowRecord

_T = TypeVar("_T")

OPEN_AT_CLOSE: Final = "open at close"
"""The note of a span that was still open when the timeline closed."""

_BATCH: Final = 2000
"""Events handed to the writer at a time, so that the recording process holds few of them."""


class Timeline:
    """The spans of one process, buffered and written to ``<root>/timeline/<process>.trace.json.gz``
    (and ``<process>.<k>.trace.json.gz`` for the k-th part of a long run); ``root`` is
    ``save_path``."""

    def __init__(self, *, capacity: int, root: Path, process: str, clock: Anchor) -> None:
        self.capacity = capacity
        self.recorder = Recorder(self._hand_over)
        """The events recorded and not handed to the writer yet; spans and requests record
        themselves into it, while its ``room`` lasts."""
        self._handed = 0
        """Events handed to the writer since the last flush."""
        self._handed_until_write(0)
        self.closed = False
        self.process = process
        self.path = root / "timeline" / part_name(process, 1)
        self._root = root
        self._windows: dict[int, tuple[WindowRecord, list[tuple[str, int]]]] = {}
        self._clock = clock
        self._pid = os.getpid()
        self._tid = threading.get_native_id()  # the event loop's, which steps are drawn on
        self._writer: RemoteFile | ChromeTraceWriter | None = None
        self._last_write = 0
        """The number of the latest write handed to the writer thread."""
        self._failing = False
        """The last write failed (said once on the log)."""
        self._executor: ThreadPoolExecutor | None = None
        self._ledger = Ledger()
        """What the writes so far hold, for the accounting of a live run (taken by
        :meth:`take_ledger`); written by the writer thread, under ``_ledger_lock``."""
        self._ledger_lock = threading.Lock()

    def take_ledger(self) -> tuple[object, ...]:
        """The ledger of the events written since the last call
        (:meth:`aprof._accounting.Ledger.take`'s plain data); any thread."""
        with self._ledger_lock:
            return self._ledger.take()

    def add(self, event: Event) -> None:
        """Keep ``event`` if the timeline has room until its next write, else count it as
        dropped."""
        if not self.closed:
            self.recorder.add(event)

    def _hand_over(self) -> None:
        # The recorder is full: its events go to the writer while the write has room for
        # more, else the next ones are dropped (and counted) until the write.
        held = self.recorder.count
        if not self.closed and self._handed + held < self.capacity:
            self._handed_until_write(self._handed + held)
            self._submit(self._add, self.recorder.take())

    def step(self, n: int, selected: bool, begin_ns: int) -> None:
        """Record global step ``n``, begun at ``begin_ns`` and ending now."""
        self.add((STEP, begin_ns, now_ns(), n, selected))

    def window(self, record: WindowRecord, event: str) -> None:
        """Note a transition of ``record``'s window; a final one records the window."""
        ts = now_ns()
        if event in ("starting", "active", "stopping"):
            self._windows.setdefault(id(record), (record, []))[1].append((event, ts))
            return
        _, marks = self._windows.pop(id(record), (record, []))
        self._record_window(record, marks, ts, None)

    def _record_window(
        self, record: WindowRecord, marks: list[tuple[str, int]], end: int, note: str | None
    ) -> None:
        self.add(
            (
                WINDOW,
                record.target,
                record.kind,
                record.step,
                tuple(marks),
                end,
                record.state,
                record.stop_reason,
                record.forward_steps.enforced_by,
                record.error,
                note,
            )
        )

    def flush(self) -> Future[int] | None:
        """Hand what was recorded to the writer thread; returns the write, ``None`` if closed.

        Writes queued behind one another are one write: only the last writes the file, so a
        slow disk or a large file makes writes rarer instead of queueing them up.
        """
        if self.closed:
            return None
        events = self.recorder.take()
        self._handed_until_write(0)
        self._last_write += 1
        return self._submit(self._write, events, self.recorder.dropped, self._last_write)

    def _handed_until_write(self, handed: int) -> None:
        # The next batch may take what the write has room for, up to a whole batch.
        self._handed, self.recorder.room = handed, min(_BATCH, self.capacity - handed)

    def _submit(self, work: Callable[..., _T], *args: object) -> Future[_T]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="aprof-timeline")
        return self._executor.submit(work, *args)

    # -- in the writer thread ---------------------------------------------------------------

    def _writing(self) -> RemoteFile | ChromeTraceWriter:
        # In the writer thread, so that starting the writer process never delays the loop.
        if self._writer is None:
            path, root, process, clock = self.path, self._root, self.process, self._clock
            pid, tid = self._pid, self._tid
            shared = WriterProcess.shared()
            remote = (
                None
                if shared is None
                else shared.open(path, root=root, process=process, clock=clock, pid=pid, tid=tid)
            )
            self._writer = remote or ChromeTraceWriter(
                path, root=root, process=process, clock=clock, pid=pid, tid=tid
            )
        return self._writer

    def _add(self, events: bytes) -> None:
        try:
            self._writing().add_marshalled(events)
        except Exception as exc:  # nothing waits for this: say it here
            logger.warning("timeline batch lost", path=str(self.path), error=repr(exc))

    def _write(self, events: bytes, dropped: int, number: int) -> int:
        writer = self._writing()
        writer.add_marshalled(events)
        if number != self._last_write:  # a later write is queued: it writes these too
            return writer.written.bytes
        try:
            size = writer.write(dropped)
        except Exception as exc:
            if not self._failing:  # once per outage; the events wait for the next write
                logger.warning("timeline write failed", path=str(self.path), error=repr(exc))
            self._failing = True
            raise
        finally:
            self._keep_ledger(writer)
        if self._failing:
            logger.warning("timeline written again", path=str(self.path))
            self._failing = False
        return size

    def _keep_ledger(self, writer: RemoteFile | ChromeTraceWriter) -> None:
        try:
            plain = writer.take_ledger()
            if plain is not None:
                with self._ledger_lock:
                    self._ledger.merge(plain)
        except Exception as exc:  # the accounting of a live run is worth no write
            logger.warning("timeline ledger lost", path=str(self.path), error=repr(exc))

    async def write_now(self) -> None:
        """Flush and wait for the write (its errors are logged, not raised)."""
        written = self.flush()
        if written is not None:
            with contextlib.suppress(Exception):  # logged in the writer thread
                # Shielded: a cancelled wait must not cancel a write still queued, which
                # holds events taken out of the buffer.
                await asyncio.shield(asyncio.wrap_future(written))

    async def aclose(self) -> None:
        """End what is still open (noting so), write the file a last time, stop the writer."""
        if self.closed:
            return
        end = now_ns()
        for item in list(self.recorder.open):
            item._end(end, OPEN_AT_CLOSE)
        for record, marks in self._windows.values():
            self._record_window(record, marks, end, OPEN_AT_CLOSE)
        self._windows.clear()
        try:
            await self.write_now()
        finally:  # also when the close is cancelled: the write in flight still completes
            self.closed, self.recorder.room = True, 0
            if self._executor is not None:
                if isinstance(self._writer, RemoteFile):
                    self._executor.submit(self._writer.close)
                self._executor.shutdown(wait=False)

    def files(self) -> list[tuple[Path, Written]]:
        """Each part of the timeline written so far, with its size and counts as last
        written (a part passing 32 MiB is complete: the next write starts the next one)."""
        writer = self._writer
        if writer is None:
            return []
        parts, current = writer.parts, writer.written  # each replaced whole: read once
        written = [*parts, current] if current.bytes else list(parts)
        return [(self.path.with_name(part_name(self.process, w.part)), w) for w in written]
