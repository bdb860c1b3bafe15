"""The messages between a recording process and its timeline writer process.

Through the child's stdin come marshal'd tuples, each after its length (8 bytes,
little-endian):

- ``(OPEN, file, root, path, process, wall_ns, monotonic_ns, pid, tid)``: a timeline file to
  write, below ``root``;
- ``(EVENTS, file, events)``: events for its next write, ``events`` being a recorder's
  ``take()`` (marshal's bytes of a list);
- ``(WRITE, file, dropped)``: write it now; one answer follows;
- ``(CLOSE, file)``: no more writes to it.

Through its stdout go lines: ``ready`` once, then one per ``WRITE``, ``written <bytes> <events>
<dropped> <part>`` or ``failed <repr of the error>``. Standard library only: both sides load it.
"""

from __future__ import annotations

import marshal
from typing import IO, Any, Final

OPEN: Final = 0
EVENTS: Final = 1
WRITE: Final = 2
CLOSE: Final = 3

READY: Final = b"ready\n"
"""The child's first line: it serves from now on."""


def frame(message: tuple[Any, ...]) -> bytes:
    """``message`` as it goes through the pipe: its length, then marshal's bytes."""
    data = marshal.dumps(message)
    return len(data).to_bytes(8, "little") + data


def receive(source: IO[bytes]) -> tuple[Any, ...] | None:
    """The next message from ``source``; ``None`` once it ended (maybe in the middle of one)."""
    # Read whole, then loaded: marshal.load on a file reads it object by object, 20x slower.
    size = int.from_bytes(source.read(8), "little")
    data = source.read(size)
    if not size or len(data) < size:
        return None
    message: tuple[Any, ...] = marshal.loads(data)
    return message


def written(size: int, events: int, dropped: int, part: int) -> bytes:
    """The answer to a write that succeeded."""
    return b"written %d %d %d %d\n" % (size, events, dropped, part)


def failed(error: BaseException) -> bytes:
    """The answer to a write that failed."""
    return f"failed {error!r}".replace("\n", " ").encode() + b"\n"


def parse_answer(line: bytes) -> tuple[int, int, int, int] | str | None:
    """A write's answer: the written file's numbers, the error text of a failed write, or
    ``None`` for anything else (the child ended)."""
    kind, _, rest = line.decode(errors="replace").rstrip("\n").partition(" ")
    if kind == "written":
        size, events, dropped, part = map(int, rest.split())
        return size, events, dropped, part
    if kind == "failed":
        return rest
    return None
