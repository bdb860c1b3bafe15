"""The timeline writer process: one child per interpreter that writes all of its timeline files.

Formatting and compressing an event costs about 2 µs, and in a thread of the recording process
that time holds the GIL its event loop needs. The child does it instead; the recording process
records events in marshal's format already (its recorder) and writes them into the child's
stdin, a batch at a time while the run goes on; the child turns each batch into compressed
JSON as it comes and writes the file when asked. The child starts at the first write of the
interpreter, serves every timeline after that, and ends when its stdin does: when the
interpreter exits, or when the recording process ends in any way, SIGKILL included. The
messages are ``protocol.py``'s; the child's program is ``writer_child.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import itertools
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, ClassVar, Final

from aprof import _safe_files
from aprof._logging import logger
from aprof._timeline import protocol
from aprof._timeline.chrome_trace import Anchor, Written

_START_S: Final = 30.0
"""How long the child may take to say it is ready."""
_END_S: Final = 10.0
"""How long the child may take to end at exit, once its stdin is closed."""
_PIPE_BYTES: Final = 1 << 20
"""The pipe's size asked for (Linux's default limit for a user): a batch is about 150 kB."""
_WRITE_S: Final = 120.0
"""How long the child may take to take a message in, or to answer a write, before it counts
as stuck and is killed: the writer thread, and the profiler's close that waits for it, must
not wait forever."""
_CHILD: Final = (
    # The child imports aprof's standard-library-only modules without running aprof's
    # __init__ (whose dependencies -S leaves out): the two packages are made empty shells.
    "import sys, types\n"
    "for name, path in zip(('aprof', 'aprof._timeline'), sys.argv[1:3]):\n"
    "    sys.modules[name] = package = types.ModuleType(name)\n"
    "    package.__path__ = [path]\n"
    "from aprof._timeline.writer_child import main\n"
    "main()\n"
)


class WriterProcess:
    """The child process writing this interpreter's timelines; safe to use from any thread."""

    _shared: ClassVar[WriterProcess | None] = None
    _starting: ClassVar = threading.Lock()

    def __init__(self, proc: subprocess.Popen[bytes], send: IO[bytes], answers: IO[bytes]) -> None:
        self._proc = proc
        self._send = send
        os.set_blocking(send.fileno(), False)  # sends are bounded (_deliver), never buffered
        if hasattr(fcntl, "F_SETPIPE_SZ"):  # Linux: a whole batch in one write, most times
            with contextlib.suppress(OSError):
                fcntl.fcntl(send.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        self._answers = answers
        self._pid = os.getpid()  # a forked child process needs its own writer
        self._lock = threading.Lock()  # one exchange at a time
        self._files = itertools.count(1).__next__
        self.ended = False
        self._why = "the timeline writer process ended"  # what later sends and writes raise

    @classmethod
    def shared(cls) -> WriterProcess | None:
        """The running writer process, started now if there is none; ``None`` (logged) if it
        cannot start."""
        with cls._starting:
            shared = cls._shared
            if shared is None or shared.ended or shared._pid != os.getpid():
                shared = cls._shared = cls._start()
            return shared

    @classmethod
    def _start(cls) -> WriterProcess | None:
        package = os.path.dirname(os.path.abspath(_safe_files.__file__))
        timeline = os.path.dirname(os.path.abspath(protocol.__file__))
        # -I -S: it needs the standard library alone, so neither the working folder nor
        # PYTHONPATH nor any site folder is on its sys.path to shadow a module of it.
        command = [sys.executable, "-I", "-S", "-c", _CHILD, package, timeline]
        try:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except (OSError, ValueError) as exc:
            logger.warning("timeline writer process failed to start", error=repr(exc))
            return None
        assert proc.stdin is not None and proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], _START_S)
        answer = proc.stdout.readline() if ready else b""
        if answer != protocol.READY:
            logger.warning("timeline writer process failed to start", error=repr(answer))
            _end(proc, proc.stdin, proc.stdout, 0)
            return None
        writer = cls(proc, proc.stdin, proc.stdout)
        atexit.register(writer.close)
        return writer

    def open(
        self, path: Path, *, root: Path, process: str, clock: Anchor, pid: int, tid: int
    ) -> RemoteFile | None:
        """A handle for writing ``path`` (below ``root``, no link followed there) through this
        process; ``None`` if it has ended."""
        file = self._files()
        where = (str(root.absolute()), str(path.absolute()))
        setup = (protocol.OPEN, file, *where, process, clock.wall_ns, clock.monotonic_ns)
        try:
            with self._lock:
                self._deliver(protocol.frame((*setup, pid, tid)))
        except OSError:
            return None
        return RemoteFile(self, file)

    def add(self, file: int, events: bytes) -> None:
        """Send ``events`` (``Recorder.take()``'s) for the next write of ``file``."""
        data = protocol.frame((protocol.EVENTS, file, events))
        with self._lock, contextlib.suppress(OSError):  # the write that follows says so
            self._deliver(data)

    def write(self, file: int, dropped: int) -> tuple[Written, Any]:
        """Have ``file`` written with what :meth:`add` sent since its last write; waits for
        the child's answer: the file's numbers and its ledger's plain data."""
        with self._lock:
            self._deliver(protocol.frame((protocol.WRITE, file, dropped)))
            try:
                # One line answers each write, so nothing waits in the reader's buffer.
                ready, _, _ = select.select([self._answers], [], [], _WRITE_S)
                line = self._answers.readline() if ready else None
            except OSError:
                line = b""
            if line is None:
                self._kill(f"the timeline writer process did not write within {_WRITE_S:g} s")
                raise OSError(self._why)
            answer = protocol.parse_answer(line)
            if isinstance(answer, tuple):
                numbers, ledger = answer
                return Written(*numbers), ledger
            if isinstance(answer, str):
                raise OSError(answer)
            self.ended = True
            self._why = f"the timeline writer process ended (exit code {self._proc.poll()})"
            raise OSError(self._why)

    def forget(self, file: int) -> None:
        """Tell the child that ``file`` gets no more writes."""
        with self._lock, contextlib.suppress(OSError):
            self._deliver(protocol.frame((protocol.CLOSE, file)))

    def _deliver(self, message: bytes) -> None:
        """Send one framed message whole (under the lock); ``OSError`` if the child ended or did not
        take it within ``_WRITE_S`` (then it is killed)."""
        if self.ended:
            raise OSError(self._why)
        data = memoryview(message)
        fd, until = self._send.fileno(), time.monotonic() + _WRITE_S
        try:
            while data:
                _, ready, _ = select.select([], [fd], [], max(0.0, until - time.monotonic()))
                if not ready:
                    self._kill(f"the timeline writer process took nothing in for {_WRITE_S:g} s")
                    raise OSError(self._why)
                with contextlib.suppress(BlockingIOError):  # another holder filled the pipe
                    data = data[os.write(fd, data) :]
        except OSError:
            self.ended = True
            raise

    def _kill(self, why: str) -> None:
        self.ended, self._why = True, why
        self._proc.kill()

    def close(self) -> None:
        """End the child once its writes are done; killed if it takes longer than ``_END_S``."""
        self.ended = True
        if self._pid != os.getpid():
            return  # a forked copy: the child and its pipes are the parent's to end
        with self._lock:
            _end(self._proc, self._send, self._answers, _END_S)


def _forget_in_fork() -> None:
    # A forked copy of the recording process must not keep the pipes open: the writer
    # process ends when the last holder of its stdin closes it, and a long-lived fork (a data
    # loader worker) would keep it alive after the recording process ended. The pipes are
    # pointed at /dev/null rather than closed, so their file objects stay harmless.
    shared, WriterProcess._shared = WriterProcess._shared, None
    WriterProcess._starting = threading.Lock()  # it may have been held by another thread
    if shared is None:
        return
    shared.ended = True
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for stream in (shared._send, shared._answers):
            with contextlib.suppress(OSError, ValueError):
                os.dup2(null, stream.fileno())
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_forget_in_fork)


class RemoteFile:
    """One timeline file written by the writer process; used from one thread."""

    def __init__(self, process: WriterProcess, file: int) -> None:
        self._process = process
        self._file = file
        self.written = Written(0, 0, 0)
        """The current part as last written; replaced whole, so another thread reads one
        write's."""
        self.parts: tuple[Written, ...] = ()
        """The parts before the current one, complete."""
        self._ledger: Any = None
        """The ledger the last write's answer brought, not taken yet."""

    def add_marshalled(self, events: bytes) -> None:
        """Hand ``events`` (``Recorder.take()``'s) to the next write."""
        self._process.add(self._file, events)

    def take_ledger(self) -> Any:
        """The ledger of the events written since the last call (``None``: none came)."""
        ledger, self._ledger = self._ledger, None
        return ledger

    def write(self, dropped: int) -> int:
        """Rewrite the file with what :meth:`add` took since the last write; returns its size."""
        written, self._ledger = self._process.write(self._file, dropped)
        if written.part != self.written.part and self.written.bytes:
            self.parts = (*self.parts, self.written)
        self.written = written
        return written.bytes

    def close(self) -> None:
        """No more writes to this file."""
        self._process.forget(self._file)


def _end(proc: subprocess.Popen[bytes], send: IO[bytes], answers: IO[bytes], wait_s: float) -> None:
    with contextlib.suppress(OSError):  # raised if it has ended already
        send.close()  # its stdin ends: it returns
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    answers.close()
