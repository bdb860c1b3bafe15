"""The manifest of a live run as files, written off the event loop.

A change marks its step (or the run) for writing; ``WRITE_AFTER_S`` later the marked files
(``manifest.json``, ``manifest/step_<n>.json``) are serialized (a step holds one window per
target, so this costs the same at step 10,000 as at step 1) and handed to a writer thread,
which replaces each file atomically inside ``save_path``. When the disk refuses a write, the
thread keeps the newest version of every file it could not write (up to ``_WAITING_BYTES``),
tries again with each new change and every ``RETRY_S``, and reports the trouble once, and once
more when writes succeed again. Finished steps leave memory once more than
``RETAINED_WINDOWS`` windows are held.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from aprof._layout import OutputLayout
from aprof._logging import logger
from aprof._manifest.model import (
    FILENAME,
    STEPS_FOLDER,
    HostClock,
    HostFile,
    Manifest,
    Note,
    RunFile,
    StepFile,
    TimelineFile,
    WindowRecord,
)

RETAINED_WINDOWS: Final = 2_000
"""Windows of finished steps kept in the live manifest; older ones are read back from disk
(``aprof.load_manifest``)."""
WRITE_AFTER_S: Final = 0.02
"""Changes made within this long are written together: at most 50 passes a second turn
changes into files, however many windows change at once."""
RETRY_S: Final = 2.0
"""How often a file the disk refused is tried again when nothing new comes."""
_WAITING_BYTES: Final = 256 << 20
"""Versions kept for a disk that refuses them; beyond, the oldest step files are given up
(and counted): a disk that stays full must not fill the memory too."""

OnTrouble = Callable[[str | None], None]
"""Told the error text when writing starts to fail, ``None`` when it succeeds again."""
Key = tuple[str, ...]
"""A file's path below ``save_path``, as names."""


@dataclass(eq=False)
class _Step:
    windows: list[WindowRecord] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    written_before: bool = False
    """A version of this step's file was handed to the writer in this run."""


class ManifestFiles:
    """Keeps ``manifest.json`` and the step files of one live run up to date."""

    def __init__(
        self,
        manifest: Manifest,
        layout: OutputLayout,
    ) -> None:
        self.manifest = manifest
        """The live view: every window of the steps still held."""
        self._layout = layout
        self._steps: dict[int, _Step] = {}
        self._released: set[int] = set()
        """Steps whose records left memory (their files handed to the writer)."""
        self._run_notes: list[Note] = []
        """Notes kept in the run file: of no step, or of a step already released."""
        self._dirty: set[int] = set()
        self._run_dirty = False
        self._scheduled = False
        self._own_timeline: list[TimelineFile] = []
        self._other_timelines: dict[str, list[TimelineFile]] = {}
        """Other processes' timeline files, by process, as they last reported them."""
        self._before_write_hooks: list[Callable[[int], None]] = []
        self._trouble_listeners: list[OnTrouble] = []
        self._writer: _Writer | None = None

    def listen_trouble(self, listener: OnTrouble) -> None:
        """Have ``listener`` told, on the event loop, each time writing starts to fail and
        each time it succeeds again, from now on."""
        self._trouble_listeners.append(listener)

    def before_write(self, hook: Callable[[int], None]) -> None:
        """Have ``hook(step)`` run before each step's file is serialized from now on (counts
        kept elsewhere are brought up to date there)."""
        self._before_write_hooks.append(hook)

    def open(self) -> None:
        """Start the writer thread and write the run file (an earlier run's is kept aside)."""
        loop = asyncio.get_running_loop()

        def report(error: str | None) -> None:  # in the writer thread
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to tell
                loop.call_soon_threadsafe(self._trouble, error)

        self._writer = _Writer(self._layout, report)
        self._run_dirty = True
        self._write_marked(keep_previous_run=True)

    def _trouble(self, error: str | None) -> None:
        for listener in self._trouble_listeners:
            listener(error)

    # -- changes ------------------------------------------------------------------------------

    def add_window(self, record: WindowRecord) -> None:
        """A new window of ``record.step``, a step whose records are still held."""
        self.manifest.windows.append(record)
        self._step(record.step).windows.append(record)
        self.changed(record.step)

    def add_note(self, note: Note) -> None:
        """A new note, of its step or of the run."""
        self.manifest.notes.append(note)
        if note.step is None or note.step in self._released:
            self._run_notes.append(note)
            self.changed(None)
        else:
            self._step(note.step).notes.append(note)
            self.changed(note.step)

    def list_timeline(self, files: list[TimelineFile], *, process: str | None = None) -> None:
        """The timeline files of this process (or of another ``process``, as it last
        reported them): the run's list is this process's, then the others'."""
        if process is None:
            if not files:
                return  # nothing written yet: the last list stands
            self._own_timeline = files
        else:
            self._other_timelines[process] = files
        listed = self._own_timeline + [f for o in self._other_timelines.values() for f in o]
        if self.manifest.timeline != listed:
            self.manifest.timeline = listed
            self.changed(None)

    def otel_counts(self, spans: int, dropped: int) -> None:
        """What the run's OTLP receiver kept (``spans``) and dropped so far: its record says
        so, once the run has one."""
        record = self.manifest.otel
        if record is not None:
            record.spans, record.dropped = spans, dropped
            self.changed(None)

    def hosts_and_files(self, hosts: list[HostClock], files: list[HostFile] | None) -> None:
        """Each host's measured clock, and every file of the run on every host (``None``:
        as listed before)."""
        self.manifest.hosts = hosts
        if files is not None:
            self.manifest.files = files
        self.changed(None)

    def put(self, key: Key, data: bytes) -> None:
        """Have another file of the run (``key`` below ``save_path``) written by the same
        thread, atomically and newest version first: the control folder's answers and
        status. One that cannot be written is logged and dropped, never tried again and no
        trouble of the manifest's; dropped too once the files are closed."""
        if self._writer is not None:
            self._writer.put(key, data, keep_previous=False, guarded=False)

    def window(self, step: int, target: str) -> WindowRecord | None:
        """The record of ``target``'s window of ``step``, if that step is still held."""
        held = self._steps.get(step)
        if held is None:
            return None
        return next((w for w in held.windows if w.target == target), None)

    def changed(self, step: int | None) -> None:
        """Something of ``step`` (``None``: of the run) changed: write it soon."""
        if step is None:
            self._run_dirty = True
        else:
            self._dirty.add(step)
        if not self._scheduled and self._writer is not None:
            self._scheduled = True
            asyncio.get_running_loop().call_later(WRITE_AFTER_S, self._write_marked)

    # -- writing ------------------------------------------------------------------------------

    def _write_marked(self, *, keep_previous_run: bool = False) -> None:
        """Serialize what changed and hand it to the writer thread."""
        self._scheduled = False
        writer = self._writer
        if writer is None:
            return
        for n in sorted(self._dirty):
            step = self._steps.get(n)
            if step is None:  # released: its file holds it all
                continue
            for hook in self._before_write_hooks:
                hook(n)
            data = StepFile.model_construct(
                run_id=self.manifest.run_id, step=n, windows=step.windows, notes=step.notes
            ).model_dump_json(by_alias=True, indent=1)
            first = not step.written_before
            writer.put((STEPS_FOLDER, f"step_{n}.json"), data.encode(), keep_previous=first)
            step.written_before = True
        self._dirty.clear()
        if self._run_dirty:
            self._run_dirty = False
            m = self.manifest
            run = RunFile.model_construct(
                run_id=m.run_id,
                clock=m.clock,
                save_path=m.save_path,
                notes=self._run_notes,
                timeline=m.timeline,
                trace_salt=m.trace_salt,
                otel=m.otel,
                hosts=m.hosts,
                files=m.files,
                config=m.config,
            )
            text = run.model_dump_json(by_alias=True, indent=1)
            writer.put((FILENAME,), text.encode(), keep_previous=keep_previous_run)
        if len(self.manifest.windows) > RETAINED_WINDOWS:
            self._release()

    def _release(self) -> None:
        """Let go of the oldest finished steps (handed to the writer: on disk, or waiting
        there) until a tenth of ``RETAINED_WINDOWS`` is free again: a little at a time, so
        that no pass frees thousands of records at once."""
        m = self.manifest
        held = len(m.windows)
        released: set[int] = set()
        newest = max(self._steps)  # the step in progress may still get windows
        for n, step in self._steps.items():
            if held <= RETAINED_WINDOWS - RETAINED_WINDOWS // 10:
                break
            if n != newest and not any(w.state == "running" for w in step.windows):
                released.add(n)
                held -= len(step.windows)
        for n in released:
            del self._steps[n]
        self._released |= released
        # Windows are appended step by step: the released ones are mostly the first ones.
        first = next((i for i, w in enumerate(m.windows) if w.step not in released), len(m.windows))
        del m.windows[:first]
        if len(m.windows) > held:  # a window still running kept an older step in memory
            m.windows = [w for w in m.windows if w.step not in released]
        m.notes = [note for note in m.notes if note.step not in released]

    def take_given_up(self) -> list[str]:
        """The files given up unwritten (while the disk refused them) since the last call."""
        if self._writer is None:
            return []
        given_up, self._writer.given_up = self._writer.given_up, []
        return given_up

    async def flush(self, limit_s: float) -> None:
        """Write what changed and wait (at most ``limit_s``) until every file handed to the
        writer is on disk or refused."""
        self._write_marked()
        if self._writer is not None:
            await asyncio.to_thread(self._writer.wait_idle, limit_s)

    async def aclose(self, limit_s: float) -> None:
        """Write what is left and stop the writer thread (waiting at most ``limit_s``)."""
        await self.flush(limit_s)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _step(self, n: int) -> _Step:
        step = self._steps.get(n)
        if step is None:
            step = self._steps[n] = _Step()
        return step


@dataclass(slots=True)
class _Item:
    data: bytes
    keep_previous: bool
    guarded: bool
    """A manifest file: a failed write is the disk guard's trouble, and tried again."""


class _Writer:
    """One thread writing files below ``save_path``, newest version first-come."""

    def __init__(self, layout: OutputLayout, report: OnTrouble) -> None:
        self._layout = layout
        self._report = report
        self._cond = threading.Condition()
        self._pending: dict[Key, _Item] = {}
        self._busy: Key | None = None
        self._failing: str | None = None
        self._failures = 0
        self._waiting_bytes = 0
        self.given_up: list[str] = []
        """Files whose versions were dropped unwritten while the disk refused them."""
        self._closing = False
        self._other_failing: str | None = None
        """Why the last other file (not the manifest's) could not be written."""
        self._thread = threading.Thread(target=self._run, name="aprof-manifest", daemon=True)
        self._thread.start()

    def put(self, key: Key, data: bytes, *, keep_previous: bool, guarded: bool = True) -> None:
        """Have ``key`` written with ``data`` (a newer version replaces one still waiting)."""
        with self._cond:
            waiting = self._pending.pop(key, None)
            keep = keep_previous or (waiting is not None and waiting.keep_previous)
            self._waiting_bytes += len(data) - (0 if waiting is None else len(waiting.data))
            self._pending[key] = _Item(data, keep, guarded)
            while self._waiting_bytes > _WAITING_BYTES and len(self._pending) > 1:
                oldest = next(k for k in self._pending if k != (FILENAME,))
                self._waiting_bytes -= len(self._pending.pop(oldest).data)
                self.given_up.append("/".join(oldest))
            self._cond.notify_all()

    def wait_idle(self, limit_s: float) -> None:
        """Try what waits now (refused files too) and wait until all of it is on disk, or a
        write fails, or ``limit_s`` passes."""
        with self._cond:
            failures = self._failures
            self._cond.notify_all()  # wakes the thread out of its pause between retries
            self._cond.wait_for(
                lambda: self._failures > failures or (not self._pending and self._busy is None),
                timeout=limit_s,
            )

    def close(self) -> None:
        """Stop once what is pending has been tried (the thread is a daemon: a disk that
        hangs keeps neither the run nor the interpreter's exit waiting)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            removed = self._layout.remove_stale_temp_files()
        except OSError as exc:
            removed = 0
            logger.debug("stale temp files not removed", error=repr(exc))
        if removed:
            logger.info("removed temp files of killed runs", count=removed)
        retry_at = 0.0
        while True:
            with self._cond:
                while True:
                    due = self._pending and time.monotonic() >= retry_at
                    if due or (self._closing and (not self._pending or self._failing)):
                        break
                    self._cond.wait(None if not self._pending else RETRY_S)
                    retry_at = 0.0  # something new came (or the retry is due): try now
                if not due:
                    return
                key = next(iter(self._pending))
                item = self._pending.pop(key)
                self._waiting_bytes -= len(item.data)
                self._busy = key
            error = self._write(key, item)
            with self._cond:
                self._busy = None
                if not item.guarded:  # not the manifest's: no trouble of the guard's
                    self._unguarded(error)
                if error is not None and item.guarded:
                    self._failures += 1
                    if key not in self._pending:  # else a newer version waits already
                        self._pending[key] = item
                        self._waiting_bytes += len(item.data)
                    retry_at = time.monotonic() + RETRY_S
                    first, self._failing = self._failing is None, error
                elif (
                    item.guarded
                    and self._failing is not None
                    and not any(waiting.guarded for waiting in self._pending.values())
                ):
                    self._failing, first = None, True
                else:
                    first = False
                if first:  # before waiters wake: a flush that returns finds the news told
                    self._report(self._failing)
                self._cond.notify_all()

    def _unguarded(self, error: str | None) -> None:
        """An other file was written (``None``) or not: said on the log once each way."""
        if (error is None) == (self._other_failing is None):
            return
        if error is not None:
            logger.warning("control file not written", error=error)
        else:
            logger.info("control files written again")
        self._other_failing = error

    def _write(self, key: Key, item: _Item) -> str | None:
        path = self._layout.root.joinpath(*key)
        try:
            self._layout.write(path, item.data, keep_previous=item.keep_previous)
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}" if exc.strerror else f"{path}: {exc}"
        return None
