"""The timeline: spans as events in a bounded buffer, written off the event loop.

A span is recorded once, when it ends, as one event holding its begin and end (monotonic ns).
Spans and requests, the hot path, record themselves into the timeline's ``Recorder``
(``aprof/_recorder.c``), which holds events in marshal's format; steps and windows come
through :meth:`Timeline.add`. The timeline takes at most ``buffer_events`` events between two
writes of its file, and what does not fit is dropped and counted. Every ``_BATCH`` events, and
at each flush, a writer thread per timeline hands them to the interpreter's writer process
(``aprof/_writer_process.py``), which turns them into Chrome trace JSON and gzip
(``aprof/_chrome_trace.py``) and writes the file at each flush; where that process cannot
start, the thread does it all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from aprof._chrome_trace import STEP, WINDOW, ChromeTraceWriter, Event, Written
from aprof._logging import logger
from aprof._manifest import Clock
from aprof._recorder import Recorder
from aprof._writer_process import RemoteFile, WriterProcess

if TYPE_CHECKING:
    from aprof._manifest import WindowRecord

AttrValue = str | int | float | bool | None
_T = TypeVar("_T")

OPEN_AT_CLOSE: Final = "open at close"
"""The note of a span that was still open when the timeline closed."""

now_ns = time.monotonic_ns
"""The timeline's clock, the manifest's ``clock.monotonic_ns`` anchors it to wall time."""

_BATCH: Final = 2000
"""Events handed to the writer at a time, so that the recording process holds few of them."""


class Timeline:
    """The spans of one process, buffered and written to ``<folder>/<process>.trace.json.gz``."""

    def __init__(self, *, capacity: int, folder: Path, process: str, clock: Clock) -> None:
        self.capacity = capacity
        self.recorder = Recorder(self._hand_over)
        """The events recorded and not handed to the writer yet; spans and requests record
        themselves into it, while its ``room`` lasts."""
        self._handed = 0
        """Events handed to the writer since the last flush."""
        self._handed_until_write(0)
        self.closed = False
        self.process = process
        self.path = folder / f"{process}.trace.json.gz"
        self._windows: dict[int, tuple[WindowRecord, list[tuple[str, int]]]] = {}
        self._clock = clock
        self._pid = os.getpid()
        self._tid = threading.get_native_id()  # the event loop's, which steps are drawn on
        self._writer: RemoteFile | ChromeTraceWriter | None = None
        self._executor: ThreadPoolExecutor | None = None

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
        """Hand what was recorded to the writer thread; returns the write, ``None`` if closed."""
        if self.closed:
            return None
        events = self.recorder.take()
        self._handed_until_write(0)
        return self._submit(self._write, events, self.recorder.dropped)

    def _handed_until_write(self, handed: int) -> None:
        # The next batch may take what the write has room for, up to a whole batch.
        self._handed, self.recorder.room = handed, min(_BATCH, self.capacity - handed)

    def _submit(self, work: Callable[..., _T], *args: object) -> Future[_T]:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="aprof-timeline")
        done = self._executor.submit(work, *args)
        done.add_done_callback(_log_failure)
        return done

    # -- in the writer thread ---------------------------------------------------------------

    def _writing(self) -> RemoteFile | ChromeTraceWriter:
        # In the writer thread, so that starting the writer process never delays the loop.
        if self._writer is None:
            process, clock, pid, tid = self.process, self._clock, self._pid, self._tid
            shared = WriterProcess.shared()
            remote = (
                None
                if shared is None
                else shared.open(self.path, process=process, clock=clock, pid=pid, tid=tid)
            )
            self._writer = remote or ChromeTraceWriter(
                self.path, process=process, clock=clock, pid=pid, tid=tid
            )
        return self._writer

    def _add(self, events: bytes) -> None:
        self._writing().add_marshalled(events)

    def _write(self, events: bytes, dropped: int) -> int:
        writer = self._writing()
        writer.add_marshalled(events)
        return writer.write(dropped)

    async def write_now(self) -> None:
        """Flush and wait for the write (its errors are logged, not raised)."""
        written = self.flush()
        if written is not None:
            with contextlib.suppress(Exception):  # logged by _log_failure
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

    @property
    def written(self) -> Written:
        """Size, events and dropped count of the file as last written (0s before that)."""
        writer = self._writer
        return Written(0, 0, 0) if writer is None else writer.written


def _log_failure(done: Future[Any]) -> None:
    exc = done.exception()
    if exc is not None:
        logger.warning("timeline write failed", error=repr(exc))
