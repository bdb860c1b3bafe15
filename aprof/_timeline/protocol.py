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
<dropped> <part> <ledger>`` (``ledger``: the base64 of marshal's bytes of the file's
``take_ledger()``) or ``failed <repr of the error>``. Standard library only: both sides load it.
"""

from __future__ import annotations

import base64
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


def written(size: int, events: int, dropped: int, part: int, ledger: Any) -> bytes:
    """The answer to a write that succeeded."""
    blob = base64.b64encode(marshal.dumps(ledger))
    return b"written %d %d %d %d %s\n" % (size, events, dropped, part, blob)


def failed(error: BaseException) -> bytes:
    """The answer to a write that failed."""
    return f"failed {error!r}".replace("\n", " ").encode() + b"\n"


def parse_answer(line: bytes) -> tuple[tuple[int, int, int, int], Any] | str | None:
    """A write's answer: the written file's numbers and its ledger, the error text of a
    failed write, or ``None`` for anything else (the child ended)."""
    kind, _, rest = line.decode(errors="replace").rstrip("\n").partition(" ")
    if kind == "written":
        size, events, dropped, part, blob = rest.split()
        return (int(size), int(events), int(dropped), int(part)), marshal.loads(
            base64.b64decode(blob)
        )
    if kind == "failed":
        return rest
    return None
