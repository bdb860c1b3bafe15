"""The timeline writer process's program: it writes every timeline file of one interpreter.

Started by ``aprof._timeline.writer_process`` as ``python -I -S``, so that it imports nothing
but the standard library and aprof's standard-library-only modules (``protocol``,
``chrome_trace``, ``events``, ``aprof._safe_files``), which it loads without running aprof's
``__init__``. It ends when its stdin does.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import IO, NamedTuple

from aprof._timeline import protocol
from aprof._timeline.chrome_trace import ChromeTraceWriter


class _Clock(NamedTuple):
    wall_ns: int
    monotonic_ns: int


def serve(source: IO[bytes], reply: IO[bytes]) -> None:
    """Write timelines as ``source`` asks, answering on ``reply``, until ``source`` ends."""
    writers: dict[int, ChromeTraceWriter] = {}
    failed: dict[int, Exception] = {}
    answer = protocol.READY
    while True:
        if answer:
            try:
                reply.write(answer)
                reply.flush()
            except BrokenPipeError:  # the recording process ended
                return
            answer = b""
        message = protocol.receive(source)
        if message is None:
            return
        kind, file = message[0], message[1]
        if kind == protocol.EVENTS:
            try:
                writers[file].add_marshalled(message[2])
            except Exception as exc:  # answered at the write they were for
                failed.setdefault(file, exc)
        elif kind == protocol.WRITE:
            writer, error = writers.get(file), failed.pop(file, None)
            try:
                if writer is None:
                    raise LookupError(f"no timeline file {file} was opened")
                if error is not None:
                    writer.discard()
                    raise error
                writer.write(message[2])
            except Exception as exc:  # costs this write only, as in the recording process
                answer = protocol.failed(exc)
            else:
                answer = protocol.written(*writer.written, writer.take_ledger())
        elif kind == protocol.OPEN:
            root, path, process, wall_ns, monotonic_ns, pid, tid = message[2:]
            writers[file] = ChromeTraceWriter(
                Path(path),
                root=Path(root),
                process=process,
                clock=_Clock(wall_ns, monotonic_ns),
                pid=pid,
                tid=tid,
                pause_s=0,
            )
        elif kind == protocol.CLOSE:
            writers.pop(file, None)
            failed.pop(file, None)


def main() -> None:
    """Serve stdin and stdout until stdin ends."""
    # Ctrl-C reaches the whole process group: the recording process closes its timelines then,
    # and their last writes need this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)
