"""A Chrome trace JSON file (``.json``, or ``.json.gz`` as torch and aprof write it) read event
by event, in batches, with memory bounded whatever the file's size: what the merge, the report
and the servers' forward-step counters read traces with.

How it reads: the file's JSON comes through zlib in chunks (gzip members one after another);
the top-level object's keys before ``traceEvents`` are decoded as they come (:attr:`prelude`,
each value at most ``MAX_VALUE_BYTES``); the events are cut into batches at the last ``}``
that ends an event in the bytes at hand and each batch is decoded in one call: by orjson into
dicts (:data:`DICTS`: the fastest JSON decoder for Python that builds whole events), or, for
a reader that needs a few keys of each event (:class:`Fields`), by msgspec into structs that
hold only those, the rest (``args`` above all) skipped unbuilt, about three times as fast. A
batch the fast decoder refuses (a cut that fell inside a string, or what it does not take and
the standard library does: ``NaN``, an integer past 64 bits) is decoded by the standard
library, whole or event by event (orjson reads an integer beyond 64 bits as a float, where
the standard library keeps it exact). The keys after the events (where a writer puts its
clock last) come from :meth:`TraceStream.epilogue`: a second, cheap pass that
keeps only the file's last ``TAIL_BYTES`` of JSON and decodes nothing else.

A file cut short (a gzip stream or JSON that ends mid-event) gives every event before the cut;
:attr:`TraceStream.stopped` then says why it stopped.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, Generic, TypeGuard, TypeVar, cast

import msgspec
import orjson

from aprof._errors import NotRegularFileError
from aprof._traces.files import open_below

E = TypeVar("E")
S = TypeVar("S", bound=msgspec.Struct)

CHUNK: Final = 1 << 20
"""Bytes of the file read, and of JSON made from them, at a time."""
BATCH: Final = 4 << 20
"""Bytes of events decoded in one call, about (a batch ends with the event that crosses it)."""
MAX_VALUE_BYTES: Final = 64 << 20
"""The largest single event, or top-level value, taken; a larger one stops the reading."""
MAX_PEEKED: Final = 100_000
"""Events read, at most, to find the first one with a time (when the trace names no clock)."""
ABSOLUTE_US: Final = 1e15
"""``ts`` above this many µs (2001 on) are taken as µs since the epoch."""
TAIL_BYTES: Final = 64 << 10
"""How much of the file's end :meth:`TraceStream.epilogue` searches for the keys there."""
MAX_TAIL_CANDIDATES: Final = 4096
"""Brackets in that tail tried, from the end, as the events' closing one."""
_WS: Final = b" \t\n\r"
_NEXT = re.compile(rb"[^ \t\n\r]")
_EVENT_END = re.compile(rb"\}\s*[,\]]")
"""Where an event may end: a ``}`` followed by the comma before the next or the array's end."""
_DECODER = json.JSONDecoder()


class Decoder(Generic[E]):
    """How a stream gives its events: whole, as dicts (:data:`DICTS`)."""

    def batch(self, text: bytes) -> list[Any]:
        """The items of the JSON array ``text``; raises ``ValueError`` if it cannot decode it."""
        return cast("list[Any]", orjson.loads(text))

    def event(self, item: Any) -> E | None:
        """``item`` (as the standard library gave it) as an event; ``None`` when it is no JSON
        object."""
        return cast("E", item) if isinstance(item, dict) else None

    def events(self, items: list[Any]) -> tuple[list[E], int]:
        """The events among what :meth:`batch` gave, and how many items were none."""
        events = [e for e in items if isinstance(e, dict)]
        return cast("list[E]", events), len(items) - len(events)

    def ts(self, event: E) -> object:
        """The event's ``ts``."""
        return cast("dict[str, Any]", event).get("ts")


DICTS: Final[Decoder[dict[str, Any]]] = Decoder()
"""Every event whole, as a dict."""


class Fields(Decoder[S]):
    """Each event as a ``msgspec.Struct`` of the keys a reader needs (each ``object``, with a
    default): the other keys are skipped unread."""

    def __init__(self, shape: type[S]) -> None:
        self._shape = shape
        self._decode = msgspec.json.Decoder(list[shape]).decode  # type: ignore[valid-type]

    def batch(self, text: bytes) -> list[Any]:
        return cast("list[Any]", self._decode(text))

    def events(self, items: list[Any]) -> tuple[list[S], int]:
        return items, 0  # decoded as a list of the shape: every item is an event

    def event(self, item: Any) -> S | None:
        if not isinstance(item, dict):
            return None
        try:
            return msgspec.convert(item, self._shape)
        except msgspec.ValidationError:  # a key msgspec cannot hold (a key that is no str)
            return None

    def ts(self, event: S) -> object:
        return getattr(event, "ts", None)


class TraceStream(Generic[E]):
    """The events of one Chrome trace, read as they are asked for (see the module)."""

    def __init__(self, fd: int, gz: bool, decoder: Decoder[E]) -> None:
        """Read from ``fd`` (a regular file, from its start; the caller closes it), gzip when
        ``gz``, its events as ``decoder`` gives them."""
        self._fd = fd
        self._gz = gz
        self._decoder = decoder
        self._chunks = json_chunks(fd, gz)
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._array = False
        self._ended = False
        """The events' closing bracket was read."""
        self._slow_until = 0
        self._damage: BaseException | None = None
        """Why the file's JSON ended early (a gzip stream cut short, corrupt, unreadable)."""
        """Events before this position are read one at a time (a batch cut there failed)."""
        self.prelude: dict[str, Any] = {}
        """The top-level keys before ``traceEvents`` (an array-form trace has none)."""
        self.events_read = 0
        """Events given so far."""
        self.json_bytes = 0
        """Bytes of the file's JSON read so far."""
        self.skipped = 0
        """Items of ``traceEvents`` that were no JSON object."""
        self.stopped: BaseException | None = None
        """Why the events ended early (the file cut short, or damaged): those before it were
        given."""
        try:
            self._found_events = self._read_prelude()
        except (ValueError, EOFError, RecursionError):
            if self._damage is not None:  # what made it so
                raise self._damage from None
            raise
        self._peeked: list[E] | None = None
        self._clock: int | None = None

    @property
    def clock_ns(self) -> int:
        """The wall-clock time in ns that a ``ts`` of 0 stands for: ``baseTimeNanoseconds``
        (aprof's timelines, Kineto; before the events or after them), else 0 when the first
        timed event's ``ts`` is µs since the epoch (vLLM's frontend trace). Raises
        ``ValueError`` for a trace on no known clock."""
        if self._clock is None:
            self._clock = self._find_clock()
        return self._clock

    def _find_clock(self) -> int:
        base = self.prelude.get("baseTimeNanoseconds")
        if not _is_int(base) and self._found_events:  # the epilogue is a pass of its own
            base = self.epilogue().get("baseTimeNanoseconds")
        if _is_int(base):
            return base
        # Read on to the first event with a time (the batches give these events again).
        self._peeked = []
        for batch in self._read():
            self._peeked.extend(batch)
            ts = self._decoder.ts
            stamps = [t for e in batch if isinstance(t := ts(e), int | float)]
            if stamps:
                if stamps[0] > ABSOLUTE_US:
                    return 0
                break
            if len(self._peeked) > MAX_PEEKED:
                break
        raise ValueError("on no known clock (no baseTimeNanoseconds, ts not since the epoch)")

    def batches(self) -> Iterator[list[E]]:
        """The events, a batch at a time, in file order (read once)."""
        if self._peeked:
            yield self._peeked
        self._peeked = None
        yield from self._read()

    def _read(self) -> Iterator[list[E]]:
        if not self._found_events or self._ended or self.stopped is not None:
            return
        try:
            while True:
                self._skip_separators()
                if self._at(b"]"):
                    self._ended = True  # read again (the clock's look ahead, then batches): none
                    return
                self._fill(1)
                if self._pos >= len(self._buf):
                    if not self._array:
                        raise EOFError("truncated: the events end without their array closing")
                    return  # Chrome takes an array-form trace without its closing bracket
                events, skipped = self._next_batch()
                self.skipped += skipped
                self.events_read += len(events)
                if events:
                    yield events
        except (ValueError, EOFError, OSError, zlib.error, RecursionError) as exc:
            self.stopped = self._damage or exc

    def epilogue(self) -> dict[str, Any]:
        """The top-level keys after ``traceEvents``, read by a pass of their own over the
        file's last ``TAIL_BYTES`` of JSON (empty when there are none or none can be read)."""
        tail = bytearray(_tail(self._fd, self._gz))
        # The events' closing bracket is the earliest "]" after which the rest of the file is
        # the rest of an object (a "]" within an event is followed by more events, which no
        # object's rest holds); its "," becomes "{" in place to decode the rest from there.
        found: dict[str, Any] = {}
        end = len(tail)
        for _ in range(MAX_TAIL_CANDIDATES):
            close = tail.rfind(b"]", 0, end)
            if close < 0:
                break
            end = close
            after = _NEXT.search(tail, close + 1)
            if after is None or tail[after.start()] != ord(","):
                continue
            tail[after.start()] = ord("{")
            try:
                rest = orjson.loads(memoryview(tail)[after.start() :])
            except orjson.JSONDecodeError:
                continue
            finally:
                tail[after.start()] = ord(",")
            if isinstance(rest, dict):
                if "traceEvents" in rest:
                    break  # a "]" before the events: the last one found closed them
                found = rest
        return found

    # -- reading ---------------------------------------------------------------------------------

    def _read_prelude(self) -> bool:
        """Read up to the first event; whether the trace has events to read."""
        self._skip_ws()
        if self._at(b"["):
            self._array = True
            return True
        if not self._at(b"{"):
            raise ValueError("not a Chrome trace: neither an object nor an array of events")
        while True:
            self._skip_ws()
            if self._at(b"}"):
                return False
            key = self._value()
            if not isinstance(key, str):
                raise ValueError("not a Chrome trace: a key that is no string")
            self._skip_ws()
            if not self._at(b":"):
                raise ValueError("not valid JSON: no ':' after a key")
            self._skip_ws()
            if key == "traceEvents":
                if not self._at(b"["):
                    raise ValueError("not a Chrome trace: traceEvents is no list")
                return True
            self.prelude[key] = self._value()
            self._skip_ws()
            self._at(b",")

    def _next_batch(self) -> tuple[list[E], int]:
        """The next events, those up to the last event end within about ``BATCH`` bytes, and
        how many items before that end were no event."""
        self._fill(BATCH)
        start = self._pos
        if start < self._slow_until:  # a cut that fell inside a string: one at a time past it
            return self._events([self._value()])
        cut = _last_end(self._buf, start, min(len(self._buf), start + BATCH))
        if cut is None:  # no event ends within BATCH: a long event, or the last one
            return self._events([self._value()])
        piece = memoryview(self._buf)[start:cut]
        try:
            found = self._decoder.batch(b"".join((b"[", piece, b"]")))
        except ValueError:
            items = _standard(bytes(piece))
            if items is None:
                self._slow_until = cut
                return self._events([self._value()])
            self._pos = cut
            return self._events(items)
        self._pos = cut
        return self._decoder.events(found)

    def _events(self, items: list[Any]) -> tuple[list[E], int]:
        """The events among ``items`` (any JSON values), and how many were none."""
        events = [e for e in map(self._decoder.event, items) if e is not None]
        return events, len(items) - len(events)

    def _value(self) -> Any:
        """The one JSON value at the position (at most ``MAX_VALUE_BYTES``), decoded by the
        standard library; raises ``ValueError`` for one that is not, ``EOFError`` at a cut."""
        size = 1 << 16
        while True:
            self._fill(size)
            start = self._pos
            window = self._buf[start : start + size]
            text = window.decode("utf-8", "surrogateescape")
            try:
                value, end = _DECODER.raw_decode(text)
            except json.JSONDecodeError as exc:
                if len(window) == size and size < MAX_VALUE_BYTES:
                    size *= 4  # it may go on past the window
                    continue
                if len(window) < size and (exc.pos >= len(text) - 1 or "Unterminated" in exc.msg):
                    raise EOFError("truncated: the JSON ends mid-event") from None
                if len(window) == size:
                    raise ValueError(f"a value longer than {MAX_VALUE_BYTES} bytes") from None
                raise
            self._pos = start + len(text[:end].encode("utf-8", "surrogateescape"))
            return value

    def _fill(self, size: int) -> None:
        """Read on until ``size`` bytes past the position are at hand, or the file ends."""
        need = size - (len(self._buf) - self._pos)
        if need <= 0 or self._eof:
            return
        parts = [self._buf[self._pos :]]
        while need > 0:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._eof = True
                break
            except (EOFError, zlib.error, OSError) as exc:  # what came before it is read
                self._eof, self._damage = True, exc
                break
            parts.append(chunk)
            need -= len(chunk)
            self.json_bytes += len(chunk)
        self._slow_until -= self._pos
        self._buf, self._pos = b"".join(parts), 0

    def _skip_ws(self) -> None:
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < len(buf) or self._eof:
                return
            self._fill(1)

    def _skip_separators(self) -> None:
        """Past the whitespace and the comma between two events."""
        self._skip_ws()
        if self._at(b","):
            self._skip_ws()

    def _at(self, token: bytes) -> bool:
        """Consume ``token`` (one byte) if it is next."""
        self._skip_ws()
        if self._buf[self._pos : self._pos + 1] == token:
            self._pos += 1
            return True
        return False


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _standard(piece: bytes) -> list[Any] | None:
    """``piece`` as events by the standard library's decoder; ``None`` if it cannot."""
    try:
        found = json.loads(b"[" + piece + b"]")
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, list) else None


def _last_end(buf: bytes, start: int, stop: int) -> int | None:
    """Just after the last ``}`` in ``buf[start:stop]`` that may end an event."""
    found = None
    for match in _EVENT_END.finditer(buf, max(start, stop - (1 << 16)), stop):
        found = match.start() + 1
    if found is None and stop - start > 1 << 16:
        for match in _EVENT_END.finditer(buf, start, stop):
            found = match.start() + 1
    return found


def blocks(fd: int, offset: int = 0) -> Iterator[bytes]:
    """The file's bytes from ``offset``, ``CHUNK`` at a time (by position: two readers of one
    descriptor do not meet)."""
    while block := os.pread(fd, CHUNK, offset):
        offset += len(block)
        yield block


def json_chunks(fd: int, gz: bool) -> Iterator[bytes]:
    """The file's JSON, ``CHUNK`` bytes at a time at most; raises ``EOFError`` for a gzip
    stream cut short and ``zlib.error`` for a corrupt one."""
    if not gz:
        yield from blocks(fd)
        return
    inflate = zlib.decompressobj(wbits=31)
    started = False
    for block in blocks(fd):
        data = block
        while data:
            started = True
            out = inflate.decompress(data, CHUNK)
            if out:
                yield out
            if inflate.eof:
                data = inflate.unused_data
                inflate = zlib.decompressobj(wbits=31)  # the next member, if any
                started = False
            else:
                data = inflate.unconsumed_tail
    while started and not inflate.eof:  # what the last block left inside zlib
        out = inflate.decompress(b"", CHUNK)
        if not out:
            break
        yield out
    if started and not inflate.eof:
        raise EOFError("truncated: the compressed stream ends early")


def _tail(fd: int, gz: bool) -> bytes:
    """The last ``TAIL_BYTES`` of the file's JSON (what can be read of it)."""
    if not gz:
        size = os.fstat(fd).st_size
        return os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES))
    tail = b""
    try:
        for chunk in json_chunks(fd, gz):
            tail = (tail + chunk)[-TAIL_BYTES:]
    except (EOFError, zlib.error):
        pass  # what came before the damage
    return tail


@contextmanager
def open_trace(path: str | os.PathLike[str], decoder: Decoder[E]) -> Iterator[TraceStream[E]]:
    """The trace in the regular file ``path``, read as it is asked for, its events as
    ``decoder`` gives them (:data:`DICTS`: whole)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file")
        yield TraceStream(fd, os.fspath(path).endswith(".gz"), decoder)
    finally:
        os.close(fd)


@contextmanager
def open_trace_below(
    root: str | os.PathLike[str], path: str, decoder: Decoder[E]
) -> Iterator[TraceStream[E]]:
    """:func:`open_trace` of ``path``, relative to ``root``, following no link below ``root``
    (raises as :func:`aprof._traces.files.open_below`)."""
    fd = open_below(root, path)
    try:
        yield TraceStream(fd, path.endswith(".gz"), decoder)
    finally:
        os.close(fd)
