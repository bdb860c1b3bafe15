"""Timeline tuples as a Chrome trace JSON file (gzip) that Perfetto opens, rewritten whole.

The file is one gzip stream. Each write compresses only the new events (a full flush keeps the
compressed prefix byte-aligned, and the next write's events decodable on their own), copies the
previous file minus its old ending, appends the new events and a fresh ending, and renames the
result over the file: a reader, or a run killed at any moment, sees the last complete file. A
file that passes ``_PART_BYTES`` is complete; the next write starts the next part.

Concurrent spans are nestable async slices (``b``/``e``) with one ``id2.local`` per span, unique
in the file: Perfetto puts async slices on one track per (process, name of the slice), so each
replica's requests, each target's captures and each span name get their own track. Steps never
overlap, so they are ``X`` slices on the event-loop thread.

Each writer also keeps the :class:`~aprof._accounting.Ledger` of the events it writes (their
requests, steps, stages and capture starts on the wall clock): :meth:`ChromeTraceWriter.take_ledger`
hands it over after each write, so that a live run knows where each step's time went without
reading its files back.

Standard library only (and ``aprof._safe_files``, ``aprof._accounting``): the writer process
runs it (``writer_child.py``).
"""

from __future__ import annotations

import itertools
import json
import marshal
import math
import os
import stat
import time
import zlib
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from aprof._accounting import Ledger, ledger_file
from aprof._safe_files import append_file, move_aside, open_folder, replace_file
from aprof._timeline.events import REQUEST, SPAN, STEP, WINDOW, Event

_LEVEL = 1  # zlib: the timeline is written while the run goes on, so speed over ratio
_CHUNK = 500  # events serialized per piece: about a millisecond of holding the GIL
_PAUSE_S = 0.0002
"""Sleep between pieces. Releasing the GIL for a moment hands it to the event loop's thread
if that waits for it; without the pause the loop could wait a whole switch interval (5 ms)."""
_TF = ("false", "true")
_PART_BYTES = 32 << 20
"""A file this large is complete: the next write starts the next part. Each write copies the
file it extends, so a part's size bounds what a write costs, however long the run."""
_HELD_BYTES = 64 << 20
"""Compressed events a writer keeps for the next write while writes fail; beyond, the oldest
are given up and counted as dropped (a disk that stays full must not fill the memory too)."""


class Anchor(Protocol):
    """The clock anchor: the manifest's ``Clock``, or its two numbers in the writer process."""

    @property
    def wall_ns(self) -> int: ...

    @property
    def monotonic_ns(self) -> int: ...


class Written(NamedTuple):
    """A file as last written: its size, its events, the dropped count it reports, and
    which part of the timeline it is (1 for ``<process>.trace.json.gz``)."""

    bytes: int
    events: int
    dropped: int
    part: int = 1


def part_name(process: str, part: int) -> str:
    """The file name of ``part`` of a process's timeline."""
    return f"{process}.trace.json.gz" if part == 1 else f"{process}.{part}.trace.json.gz"


class ChromeTraceWriter:
    """Writes timeline events to ``path``; one instance per file, used from one thread.

    ``pid`` and ``tid`` are those of the recording process and its event-loop thread;
    ``pause_s`` is the sleep between pieces, 0 where no event loop shares the GIL.
    """

    def __init__(
        self,
        path: Path,
        *,
        root: Path,
        process: str,
        clock: Anchor,
        pid: int,
        tid: int,
        pause_s: float = _PAUSE_S,
    ) -> None:
        """``path`` lies below ``root`` (``save_path``), and no link below ``root`` is
        followed to write it."""
        self.path = path
        self._root = str(root)
        self._folders = path.parent.relative_to(root).parts
        self._lost = 0  # events given up after failed writes
        self._claimed = False  # the part's name is this writer's (an earlier file moved aside)
        self.written = Written(0, 0, 0)
        """The current part as last written; replaced whole, so another thread reads one
        write's."""
        self.parts: tuple[Written, ...] = ()
        """The parts before the current one, complete."""
        self._process = process
        self._clock = clock
        self._pid = pid
        self._tid = tid
        self._pause_s = pause_s
        self._zip: Any = None  # zlib's compressor type is not importable for annotations
        self._tail = 0
        self._stream: Any = None  # the next write's: a copy of _zip, taking what add gets
        self._body: list[bytes] = []
        self._count = 0
        self._id = itertools.count(1).__next__
        self._base = clock.monotonic_ns
        self._where = f'"pid":{self._pid},"tid":{self._tid}'
        self._names: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._ledger = Ledger()
        """What :meth:`add` took since the last write, accounted."""
        self._taken: list[tuple[object, ...]] = []
        """Each write's ledger, for :meth:`take_ledger`."""
        self._ledger_file: str | None = ledger_file(process)
        """The ledgers' file beside the timeline; ``None`` once an append failed (the report
        then reads the timeline itself)."""
        self._ledger_claimed = False
        self._wall = clock.wall_ns - clock.monotonic_ns
        """Added to a monotonic time: the wall clock's."""

    def take_ledger(self) -> tuple[object, ...]:
        """The ledger of the events written since the last call
        (:meth:`aprof._accounting.Ledger.take`'s plain data)."""
        taken, self._taken = self._taken, []
        if len(taken) == 1:
            return taken[0]
        merged = Ledger()
        for plain in taken:
            merged.merge(plain)
        return merged.take()

    def add(self, events: list[Event]) -> None:
        """Turn ``events`` into the next write's compressed JSON.

        Empties ``events``, piece by piece: freeing many tuples at once would hold the GIL,
        and stall the event loop, for milliseconds.
        """
        if self._stream is None:
            if self.written.bytes >= _PART_BYTES:
                self._next_part()
            # Compress into a copy: a failed write must leave the stream as the file has it.
            if self._zip is None:  # the first write; 31: the gzip container
                self._stream = zlib.compressobj(_LEVEL, zlib.DEFLATED, 31)
                self._body.append(self._stream.compress(self._head().encode()))
            else:
                self._stream = self._zip.copy()
        self._count += len(events)
        for piece in self._pieces(events):
            self._body.append(self._stream.compress(piece.encode()))
            time.sleep(self._pause_s)

    def add_marshalled(self, events: bytes) -> None:
        """:meth:`add` the events of ``events``, marshal's bytes of their list
        (``Recorder.take()``'s)."""
        self.add(marshal.loads(events))

    def _next_part(self) -> None:
        written = self.written
        self.parts = (*self.parts, written)
        self.path = self.path.with_name(part_name(self._process, written.part + 1))
        self._zip, self._tail, self._claimed = None, 0, False
        self.written = Written(0, 0, written.dropped, written.part + 1)

    def discard(self) -> None:
        """Forget what :meth:`add` took since the last write."""
        self._stream, self._body, self._count = None, [], 0

    def write(self, dropped: int) -> int:
        """Rewrite the file whole with what :meth:`add` took since the last write; returns
        the file's size.

        A write that fails keeps its events for the next one (up to ``_HELD_BYTES``
        compressed; beyond, they are given up and reported among the dropped). A file that
        is no longer as last written (removed, replaced, cut short) is begun again with this
        write's events; what it held is reported among the dropped.
        """
        self.add([])
        stream, body, fresh = self._stream, self._body, self._count
        self.discard()
        # A full flush: the next write's events decode on their own, should it begin again.
        body.append(stream.flush(zlib.Z_FULL_FLUSH))
        name = self.path.name
        try:
            folder = open_folder(self._root, self._folders, create=True)
            try:
                prefix = None
                if self._zip is not None:
                    prefix = _prefix(folder, name, self.written.bytes, self._tail)
                    if prefix is None:  # replaced over (a folder in the way fails the write)
                        stream, body = self._begin_again(body)
                events = fresh if self._zip is None else self.written.events + fresh
                # Where this write's events lie in the file: after the prefix kept.
                at = (0 if prefix is None else self.written.bytes - self._tail, sum(map(len, body)))
                ending = stream.copy()
                foot = self._foot(events, dropped + self._lost).encode()
                tail = ending.compress(foot) + ending.flush(zlib.Z_FINISH)
                if not self._claimed:  # an earlier run's file of the part's name
                    move_aside(folder, name)
                    self._claimed = True
                size: int = replace_file(folder, name, itertools.chain(prefix or (), body, (tail,)))
                self._keep_ledger(folder, self.written.part, events, at)
            finally:
                os.close(folder)
        except BaseException:
            if sum(map(len, body)) <= _HELD_BYTES:
                self._stream, self._body, self._count = stream, body, fresh
            else:
                self._lost += fresh
            raise
        self._zip, self._tail = stream, len(tail)
        self.written = Written(size, events, dropped + self._lost, self.written.part)
        return size

    def _keep_ledger(self, folder: int, part: int, events: int, at: tuple[int, int]) -> None:
        """This write's ledger, for :meth:`take_ledger` and appended to the ledgers' file
        (``{"part", "events", "at", "base", "ledger"}``, one JSON line per write: the report
        reads it instead of the timeline when its last line names the part and event count
        the manifest lists). ``at``: the offset and length in the part of this write's
        compressed events, which decompress on their own (raw deflate; from offset 0, the
        gzip member with the trace's head); ``base``: their clock's
        ``baseTimeNanoseconds``. A failed append ends the file's appends, never the write."""
        plain = self._ledger.take()
        self._taken.append(plain)
        name = self._ledger_file
        if name is None:
            return
        line = json.dumps(
            {
                "part": part,
                "events": events,
                "at": at,
                "base": self._clock.wall_ns,
                "ledger": plain,
            },
            separators=(",", ":"),
        )
        try:
            if not self._ledger_claimed:  # an earlier run's file of that name
                move_aside(folder, name)
                self._ledger_claimed = True
            append_file(folder, name, line.encode("ascii") + b"\n")
        except (OSError, ValueError):
            self._ledger_file = None

    def _begin_again(self, body: list[bytes]) -> tuple[Any, list[bytes]]:
        """A fresh stream holding the head and the events compressed in ``body``."""
        text = zlib.decompressobj(-zlib.MAX_WBITS).decompress(b"".join(body))
        self._lost += self.written.events
        self._ledger_file = None  # its ledgers tell of events the file no longer holds
        self._zip, self._tail = None, 0
        stream = zlib.compressobj(_LEVEL, zlib.DEFLATED, 31)
        again = [stream.compress(self._head().encode()), stream.compress(text)]
        return stream, [*again, stream.flush(zlib.Z_FULL_FLUSH)]

    # -- file frame ---------------------------------------------------------------------------

    def _head(self) -> str:
        clock = self._clock
        # Top-level keys before traceEvents, so a reader streaming the file sees them first.
        # displayTimeUnit "ms" (the format's default) says what ts is: older Perfetto trace
        # processors read every ts as nanoseconds when the file starts with "ns".
        head = (
            f'{{"displayTimeUnit":"ms","baseTimeNanoseconds":{clock.wall_ns},'
            f'"aprof":{{"process":{_quote(self._process)},"pid":{self._pid},'
            f'"clock":{{"wall_ns":{clock.wall_ns},"monotonic_ns":{clock.monotonic_ns}}}}},'
            '"traceEvents":[\n'
        )
        meta = [
            ("process_name", 0, self._process),
            ("thread_name", self._tid, "steps (event loop)"),
        ]
        return head + ",\n".join(
            f'{{"ph":"M","name":"{kind}","pid":{self._pid},"tid":{tid},'
            f'"args":{{"name":{_quote(name)}}}}}'
            for kind, tid, name in meta
        )

    def _foot(self, events: int, dropped: int) -> str:
        return (
            f'\n],"aprofStats":{{"events":{events},"dropped_events":{dropped},'
            f'"written_ns":{time.time_ns()}}}}}\n'
        )

    # -- events -------------------------------------------------------------------------------

    def _pieces(self, events: list[Event]) -> Iterator[str]:
        # The hot loop: requests and spans are formatted inline with everything in locals,
        # as f-strings, with timestamps in whole microseconds (a third of the time of %.3f).
        events.reverse()  # then each piece comes off the end, in the recorded order
        next_id, base, where, names, keys = (
            self._id,
            self._base,
            self._where,
            self._names,
            self._keys,
        )
        others = {STEP: self._step, WINDOW: self._window}
        ledger, wall = self._ledger, self._wall
        process = self._process
        while events:
            piece = events[-_CHUNK:]
            del events[-_CHUNK:]
            piece.reverse()
            out: list[str] = []
            add = out.append
            for event in piece:
                kind = event[0]
                if kind == REQUEST:
                    _, begin, end, replica, request_id, step, gated, captured = event[:8]
                    tokens, prompt, trajectory, turn, note = event[8:]
                    extra = ""
                    if tokens:
                        extra = f',"tokens":{tokens}'
                    if prompt:
                        extra += f',"prompt_tokens":{prompt}'
                    if trajectory is not None:
                        extra += f',"trajectory":{_quote(trajectory)}'
                    if turn is not None:
                        extra += f',"turn":{turn}'
                    if note is not None:
                        extra += f',"note":{_quote(note)}'
                    same = (
                        f'"cat":"request","name":"request replica_{replica}",'
                        f'"id2":{{"local":"0x{next_id():x}"}},{where}'
                    )
                    add(
                        f',\n{{"ph":"b",{same},"ts":{(begin - base) // 1000},"args":{{'
                        f'"request_id":{_scalar(request_id)},'
                        f'"step":{"null" if step is None else step},"replica":{replica},'
                        f'"gated":{_TF[gated]},"captured":{_TF[captured]}{extra}}}}}'
                        f',\n{{"ph":"e",{same},"ts":{(end - base) // 1000}}}'
                    )
                    ledger.request(
                        begin + wall,
                        end + wall,
                        step=step,
                        replica=replica,
                        request_id=request_id if isinstance(request_id, str) else None,
                        tokens=tokens,
                        prompt_tokens=prompt,
                        gated=gated,
                        process=process,
                        trajectory=trajectory,
                        turn=turn,
                    )
                elif kind == SPAN:
                    name, begin, end, step, note = event[1:6]
                    half = (len(event) - 6) // 2
                    attr_keys, attr_values = event[6 : 6 + half], event[6 + half :]
                    quoted = names.get(name)
                    if quoted is None:
                        quoted = names[name] = _quote(name)
                    args = []
                    for key, value in zip(attr_keys, attr_values, strict=True):
                        prefix = keys.get(key)
                        if prefix is None:
                            prefix = keys[key] = _quote(key) + ":"
                        args.append(prefix + _scalar(value))
                    if "step" not in attr_keys:
                        args.append(f'"step":{"null" if step is None else step}')
                    if note is not None:
                        args.append(f'"note":{_quote(note)}')
                    same = (
                        f'"cat":"span","name":{quoted},"id2":{{"local":"0x{next_id():x}"}},{where}'
                    )
                    add(
                        f',\n{{"ph":"b",{same},"ts":{(begin - base) // 1000},'
                        f'"args":{{{",".join(args)}}}}}'
                        f',\n{{"ph":"e",{same},"ts":{(end - base) // 1000}}}'
                    )
                    if "aprof" in attr_keys or "staleness" in attr_keys:
                        attrs = dict(zip(attr_keys, attr_values, strict=True))
                        ledger.span(begin + wall, end + wall, attrs, step)
                else:
                    add(others[kind](event))
            yield "".join(out)

    def _us(self, ns: int) -> int:
        # Whole microseconds since the clock anchor; with baseTimeNanoseconds that is wall time.
        return (ns - self._base) // 1000

    def _step(self, event: Event) -> str:
        _, begin, end, n, selected = event
        self._ledger.step(n, begin + self._wall, end + self._wall, profiled=selected)
        return (
            f',\n{{"ph":"X","cat":"step","name":"step {n}",{self._where},'
            f'"ts":{self._us(begin)},"dur":{self._us(end) - self._us(begin)},'
            f'"args":{{"step":{n},"profiled":{_TF[selected]}}}}}'
        )

    def _window(self, event: Event) -> str:
        _, target, kind, step, marks, end, state, reason, enforced_by, error, note = event
        replica = target.removeprefix("replica_")
        if kind == "rollout" and replica.isdigit() and len(replica) < 19:
            # The starting slice's end (as the report reads it): the capture was active, or
            # its start ended otherwise; a window that never started, at its instant.
            phases = [phase for phase, _ in marks]
            at = phases.index("starting") + 1 if "starting" in phases else len(marks)
            started = marks[at][1] if at < len(marks) else end
            self._ledger.capture_started(step, int(replica), started + self._wall)
        args: dict[str, object] = {
            "step": step,
            "target": target,
            "kind": kind,
            "state": state,
            "stop_reason": reason,
            "enforced_by": enforced_by,
        }
        if error is not None:
            args["error"] = error
        if note is not None:
            args["note"] = note
        encoded = ",".join(f"{_quote(k)}:{_scalar(v)}" for k, v in args.items())
        ident, name = self._id(), _quote(f"capture {target}")

        def line(ph: str, label: str, ns: int, with_args: bool = False) -> str:
            extra = f',"args":{{{encoded}}}' if with_args else ""
            return (
                f',\n{{"ph":"{ph}","cat":"capture","name":{label},'
                f'"id2":{{"local":"0x{ident:x}"}},{self._where},"ts":{self._us(ns)}{extra}}}'
            )

        if not marks:
            # Never started (skipped, or failed before starting): one instant on its track.
            return line("n", name, end, True)
        lines = [line("b", name, marks[0][1], True)]
        bounds = [ts for _, ts in marks[1:]] + [end]
        for (phase, begin), until in zip(marks, bounds, strict=True):
            lines.append(line("b", f'"{phase}"', begin))
            lines.append(line("e", f'"{phase}"', until))
        if reason == "auto_stop":
            stopping = [ts for phase, ts in marks if phase == "stopping"]
            lines.append(line("n", '"auto_stop"', stopping[0] if stopping else end, True))
        if state in ("failed", "timeout"):
            lines.append(line("n", f'"{state}"', end, True))
        lines.append(line("e", name, end))
        return "".join(lines)


def _scalar(value: object) -> str:
    """One span attribute as JSON; anything but str, int, float, bool or None as its str."""
    if isinstance(value, str):
        return _quote(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return _TF[value]
    if isinstance(value, int):
        return int.__repr__(value)  # plain digits also for an IntEnum
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)
    return _quote(str(value))


def _prefix(folder: int, name: str, size: int, tail: int) -> Iterator[bytes] | None:
    """The file ``name`` in ``folder`` as last written (``size`` bytes), but its last
    ``tail`` bytes, in chunks; ``None`` when it is no longer that file (no link followed)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        os.close(fd)
        return None

    def chunks() -> Iterator[bytes]:
        with os.fdopen(fd, "rb") as src:
            left = size - tail
            while left > 0:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    raise OSError(f"{name} is shorter than the {size} bytes written to it")
                yield chunk
                left -= len(chunk)

    return chunks()
