"""One process's timeline as a profiler holds it: spans and requests recorded into it, its
writes, and its files as the manifest lists them.

The driver's :class:`~aprof.Profiler` and every other process's ``RemoteProfiler``
(``aprof.ray``) each hold one; the driver's tells its manifest's files and its accounting of
each write. With ``timeline.enable: false`` it records nothing and lists no file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from aprof._accounting import STAGE
from aprof._config import TimelineConfig
from aprof._core.host import host_name
from aprof._layout import OutputLayout
from aprof._logging import logger
from aprof._manifest import Clock, TimelineFile, WindowRecord
from aprof._timeline.events import AttrValue, Event
from aprof._timeline.recorder import BACKEND, NULL_SPAN, Gate, NullSpan, Recorder, Span
from aprof._timeline.timeline import Timeline


class Recording:
    """``span`` and ``stage`` of a profiler that records into its process's timeline through
    a gate: the driver's :class:`~aprof.Profiler` and every ``RemoteProfiler``. Written out
    here, with no call between, because they are each span's hot path."""

    _gate: Gate
    _recorder: Recorder | None

    def span(self, name: str, /, **attrs: AttrValue) -> Span | NullSpan:
        """A timeline span named ``name`` (a turn, a tool call), for ``with`` or ``async with``.

        ``attrs`` become the span's args; the current step is added. A no-op when
        ``timeline.enable`` is false.
        """
        recorder = self._recorder
        if recorder is None:
            return NULL_SPAN
        return Span(recorder, name, attrs, self._gate.step)

    def stage(self, name: str, /, **attrs: AttrValue) -> Span | NullSpan:
        """A trainer stage (``update_actor``): a timeline span, for ``with`` or ``async with``,
        that the report counts as training time, in every step, profiled or not."""
        recorder = self._recorder
        if recorder is None:
            return NULL_SPAN
        return Span(recorder, name, {**attrs, "aprof": STAGE}, self._gate.step)


def open_timeline(settings: TimelineConfig, *, root: Path, process: str) -> ProcessTimeline:
    """The timeline of a process other than the driver's, below ``root``; off (said on the
    log) when ``root`` cannot be written from here."""
    if settings.enable:
        try:
            OutputLayout(root).check_writable()
        except OSError as exc:
            logger.warning(
                "timeline off: save_path not writable here", path=str(root), error=str(exc)
            )
            settings = settings.model_copy(update={"enable": False})
    return ProcessTimeline(settings, root=root, process=process)


class ProcessTimeline:
    """The timeline of one process below ``root`` (``save_path``), named ``process``."""

    def __init__(
        self,
        settings: TimelineConfig,
        *,
        root: Path,
        process: str,
        clock: Clock | None = None,
        on_files: Callable[[list[TimelineFile]], None] | None = None,
        on_ledger: Callable[[Any, str], None] | None = None,
    ) -> None:
        """Each time a write is on disk (handed over by :meth:`flush`, or waited for), in the
        event loop: ``on_files`` is told :meth:`files`, then ``on_ledger`` is given
        :meth:`take_ledger` and ``process`` (the ledger is then taken by no one else)."""
        self.process = process
        self._on_files = on_files
        self._on_ledger = on_ledger
        self._root = root
        self._host = host_name()
        """This machine, as the manifest names it beside each timeline file."""
        clock = clock or Clock(wall_ns=time.time_ns(), monotonic_ns=time.monotonic_ns())
        self.timeline = (
            Timeline(capacity=settings.buffer_events, root=root, process=process, clock=clock)
            if settings.enable
            else None
        )
        self.recorder = None if self.timeline is None else self.timeline.recorder
        """Where spans and requests record themselves; ``None`` when the timeline is off."""

    def add(self, event: Event) -> None:
        """Record ``event`` as it is."""
        if self.timeline is not None:
            self.timeline.add(event)

    def step(self, n: int, selected: bool, begin_ns: int) -> None:
        """Record global step ``n``, begun at ``begin_ns`` and ending now."""
        if self.timeline is not None:
            self.timeline.step(n, selected, begin_ns)

    def window(self, record: WindowRecord, event: str) -> None:
        """Record a move of ``record``'s window (``event`` names its new phase)."""
        if self.timeline is not None:
            self.timeline.window(record, event)

    def flush(self) -> Future[int] | None:
        """Have what was recorded written, without waiting; the write (``None`` when the
        timeline is off or closed)."""
        timeline = self.timeline
        future = None if timeline is None else timeline.flush()
        if future is None or (self._on_files is None and self._on_ledger is None):
            return future
        loop = asyncio.get_running_loop()

        def soon(_: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self._written)

        future.add_done_callback(soon)
        return future

    async def write_now(self) -> None:
        """Write what was recorded and wait for it (errors are logged, not raised)."""
        if self.timeline is not None:
            await self.timeline.write_now()
            self._written()

    async def aclose(self) -> None:
        """End what is still open, write the file a last time and stop its writer."""
        if self.timeline is not None:
            await self.timeline.aclose()
            self._written()

    def _written(self) -> None:
        """A write is on disk: tell its files and hand its ledger over."""
        if self._on_files is not None:
            self._on_files(self.files())
        if self._on_ledger is not None:
            self._on_ledger(self.take_ledger(), self.process)

    def take_ledger(self) -> Any:
        """The ledger of what was written since the last call (``None`` when the timeline
        is off): :meth:`aprof._accounting.Ledger.take`'s plain data."""
        return None if self.timeline is None else self.timeline.take_ledger()

    def files(self) -> list[TimelineFile]:
        """Each part of the timeline written so far, as the manifest lists it."""
        if self.timeline is None:
            return []
        return [
            TimelineFile(
                path=path.relative_to(self._root).as_posix(),
                process=self.process,
                bytes=written.bytes,
                events=written.events,
                dropped=written.dropped,
                recorder=BACKEND,
                host=self._host,
            )
            for path, written in self.timeline.files()
        ]

    def plain_files(self) -> list[dict[str, Any]]:
        """:meth:`files` as plain records, to hand to the driver across processes."""
        return [f.model_dump(mode="json") for f in self.files()]
