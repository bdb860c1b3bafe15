"""The captures of one step placed by worker processes beside the merging process, when more
than one core is free. The merging process takes the step's captures from the front, in the
merged file's order, and writes each into the merged file as it places it; each worker, once
started, takes them from the back (:class:`Shares`), placing one at a time (``placing.place``)
into a part file of the merge's own folder (``scratch.py``), compressed as a part of the merged
file's gzip stream (``gzip_stream.py``), which the merging process lays into the merged file as
it is when it reaches it, and removes. So a worker that starts late, or never, costs no
waiting: the merging process has placed what the worker did not take. Numbers an input gets
depend on its place alone (``placing.py``): the merged file holds the same text whoever placed
what.

A worker is a Python process (:data:`_WORKER`) that says it is ready with a line on its
standard output, then reads one task per line on its standard input and answers each with a
line; :class:`Workers` starts them at once and, for each step, serves each from a thread of
its own. It imports only the modules that place an input: the packages around them are empty
shells, so their ``__init__`` (all of aprof, half a second) does not run, and a worker is
ready in about a tenth of a second. Not ``multiprocessing``: its workers would run the
caller's main module again when it has no ``if __name__ == "__main__"`` guard. A worker that
fails, or dies, costs nothing but time: the merging process places that input itself, and
removes the part file the worker left. A part file is named for its step, its input and the
worker that writes it; workers write relative to the merge's folder, whose descriptor they
inherit with its lock (so a worker that outlives a killed merge keeps its folder alive).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

from aprof._merge.archive import ArchiveFile
from aprof._merge.flows import ForwardStep, Links
from aprof._merge.gzip_stream import PartWriter
from aprof._merge.placing import Input, Placed, Scope, place
from aprof._merge.scratch import Scratch
from aprof._safe_files import create_exclusive
from aprof._traces.stream import blocks

WORTH_BYTES: Final = 4 << 20
"""Captures of a step (on disk, gzip: ten to twenty times as much JSON) below which no worker
is started: the merging process is done before one would be ready and has taken a share."""
_SHELLS: Final = ("aprof", "aprof._merge", "aprof._otel", "aprof._timeline")
"""Packages on the way to the placing modules whose ``__init__`` imports far more."""
_WORKER: Final = (
    # Started with -P: the working folder is not on sys.path, so nothing there shadows a
    # module; the shells' paths come from this process's own files, and the libraries the
    # placing modules import are found where this process found them (PYTHONPATH and the user
    # site kept, which -I would drop: a `pip install --user` would leave no worker ready).
    "import sys, types\n"
    f"for name, path in zip({_SHELLS!r}, sys.argv[1:]):\n"
    "    sys.modules[name] = package = types.ModuleType(name)\n"
    "    package.__path__ = [path]\n"
    "from aprof._merge.parallel import serve\n"
    "serve()\n"
)
READY: Final = "ready"
"""A worker's first line: it has imported what it needs and takes tasks."""
_EXIT_S: Final = 30.0
"""How long a worker told to end may take (it ends its task first) before it is killed."""


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Part(NamedTuple):
    """What a worker placed: its result, its part file in the merge's folder, and the CRC-32
    and length of the text that file holds (compressed)."""

    placed: Placed
    name: str
    crc: int
    size: int


class Shares:
    """A step's captures not yet placed: the merging process takes them from the front, in
    order, the workers from the back."""

    def __init__(self, items: list[Input]) -> None:
        self._left = deque(items)
        self._taken: dict[int, Future[Part]] = {}
        self._lock = threading.Lock()

    def take(self, item: Input) -> Future[Part] | None:
        """For the merging process: ``None`` when it places ``item`` itself (nobody else
        took it, or it is not a share), else what the worker that took it will give."""
        with self._lock:
            if item.number in self._taken:
                return self._taken.pop(item.number)
            if self._left and self._left[0] is item:
                self._left.popleft()
            return None

    def take_last(self) -> tuple[Input, Future[Part]] | None:
        """For a worker: the last capture nobody took, and where its result goes."""
        with self._lock:
            if not self._left:
                return None
            item = self._left.pop()
            future = self._taken[item.number] = Future()
            return item, future

    def close(self) -> dict[int, Future[Part]]:
        """Give out nothing more; what workers took and the merging process did not."""
        with self._lock:
            self._left.clear()
            left, self._taken = self._taken, {}
            return left


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen[str]
    ready: bool = False
    serving: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    """Held by the thread that reads its answers: one at a time, also across steps."""


class Workers:
    """``count`` worker processes, started at once, writing into ``scratch`` (which they keep
    locked while they live), stopped by :meth:`close`."""

    def __init__(self, count: int, scratch: Scratch) -> None:
        self._scratch = scratch
        self._workers: list[_Worker] = []
        for _ in range(count):
            try:
                process = subprocess.Popen(
                    [sys.executable, "-P", "-c", _WORKER, *_shell_paths()],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    pass_fds=(scratch.fd, scratch.lock),
                )
            except OSError:  # none started: the merging process places all
                break
            self._workers.append(_Worker(process))
        self._threads = ThreadPoolExecutor(max(1, count), thread_name_prefix="aprof-merge")

    def serve(self, shares: Shares, root: Path, step: int, base_ns: int) -> list[Future[None]]:
        """Let each worker take ``shares`` from the back, once it is ready, into part files
        of the merge's folder, until no share is left; the threads that serve them. The
        merging process waits for what a worker took, never for a worker that took nothing
        (one still starting, or hung): :meth:`close` bounds those."""
        context = {"folder": self._scratch.fd, "root": str(root), "step": step, "base_ns": base_ns}
        return [
            self._threads.submit(self._serve, worker, shares, context) for worker in self._workers
        ]

    def read_part(self, part: Part) -> Iterator[bytes]:
        """The bytes of ``part``'s file (compressed), a chunk at a time; the file is removed
        after."""
        try:
            fd = os.open(
                part.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._scratch.fd
            )
            try:
                yield from blocks(fd)
            finally:
                os.close(fd)
        finally:
            self._scratch.remove(part.name)

    def discard(self, part: Part) -> None:
        """Remove ``part``'s file, unread."""
        self._scratch.remove(part.name)

    def close(self) -> None:
        """Let the workers end (each ends its task first) and wait for them, a bounded time:
        one that has not ended by then is killed, which also ends a read of its answers."""
        for worker in self._workers:
            with contextlib.suppress(OSError):
                _stdin(worker.process).close()
        for worker in self._workers:
            try:
                worker.process.wait(_EXIT_S)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        self._threads.shutdown(wait=True, cancel_futures=True)

    def _serve(self, worker: _Worker, shares: Shares, context: dict[str, Any]) -> None:
        """On a thread of the pool: ``worker`` places shares until none is left, or it dies."""
        with worker.serving:
            process = worker.process
            if not worker.ready:
                worker.ready = _stdout(process).readline().strip() == READY
                if not worker.ready:
                    return
            while (taken := shares.take_last()) is not None:
                item, future = taken
                name = part_name(context["step"], item, process.pid)
                try:
                    task = {**context, "name": name, "item": dataclasses.asdict(item)}
                    _stdin(process).write(json.dumps(task) + "\n")
                    _stdin(process).flush()
                    line = _stdout(process).readline()
                    if not line:
                        raise RuntimeError(f"merge worker ended with {process.wait()}")
                    future.set_result(_part(name, json.loads(line)))
                except Exception as exc:  # the merging process places it instead
                    # The worker answered, or is gone: it writes its part file no more.
                    self._scratch.remove(name)
                    future.set_exception(exc)
                    if process.poll() is not None or isinstance(exc, OSError):
                        worker.ready = False  # gone: it takes nothing more
                        return


def _shell_paths() -> list[str]:
    """Where each of :data:`_SHELLS` is, as this process imported it."""
    return [os.path.dirname(os.path.abspath(sys.modules[name].__file__ or "")) for name in _SHELLS]


def serve() -> None:
    """A worker: say it is ready, then place each input its standard input names, answering
    each on its standard output (which nothing else writes to: print and logs go to standard
    error), until its standard input ends."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    answers.write(READY + "\n")
    answers.flush()
    for line in sys.stdin:
        task = json.loads(line)
        try:
            item = Input(**task["item"])
            root, step, base_ns = Path(task["root"]), task["step"], task["base_ns"]
            part = _place_into_part(task["folder"], task["name"], root, step, item, base_ns)
            answer = _answer(part)
        except Exception as exc:  # this input is placed by the merging process instead
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _answer(part: Part) -> dict[str, Any]:
    placed, archived = part.placed, part.placed.archived
    return {
        "crc": part.crc,
        "size": part.size,
        "events": placed.events,
        "notes": placed.notes,
        "archived": None
        if archived is None
        else {**dataclasses.asdict(archived), "source": str(archived.source)},
        "forward": [dataclasses.astuple(step) for step in placed.forward],
    }


def part_name(step: int, item: Input, pid: int) -> str:
    """The part file of ``item`` of ``step`` that the worker ``pid`` writes in the merge's
    folder."""
    return f".step_{step}.part{item.number}.{pid}.deflate"


def _part(name: str, found: dict[str, Any]) -> Part:
    if "error" in found:
        raise RuntimeError(f"merge worker: {found['error']}")
    archived = found["archived"]
    placed = Placed(
        events=found["events"],
        notes=found["notes"],
        archived=None
        if archived is None
        else ArchiveFile(**{**archived, "source": Path(archived["source"])}),
        forward=[ForwardStep(s[0], s[1], s[2], s[3], tuple(s[4])) for s in found["forward"]],
    )
    return Part(placed, name, found["crc"], found["size"])


def _stdin(worker: subprocess.Popen[str]) -> IO[str]:
    assert worker.stdin is not None  # made with PIPE
    return worker.stdin


def _stdout(worker: subprocess.Popen[str]) -> IO[str]:
    assert worker.stdout is not None  # made with PIPE
    return worker.stdout


def _place_into_part(
    folder: int, name: str, root: Path, step: int, item: Input, base_ns: int
) -> Part:
    """In a worker: place ``item``, its text (events joined by commas) into the new file
    ``name`` of the merge's folder ``folder`` (the merging process reads it only once told it
    is whole, and removes it when the worker fails)."""
    found: list[Placed] = []
    writer = PartWriter()

    def compressed() -> Iterator[bytes]:
        pieces = place(root, step, item, base_ns, Scope(), Links())
        first = True
        while True:
            try:
                text = next(pieces)
            except StopIteration as done:
                found.append(done.value)
                break
            yield writer.write(text if first else b"," + text)
            first = False
        yield writer.end()

    with os.fdopen(create_exclusive(folder, name), "wb") as out:
        for chunk in compressed():
            out.write(chunk)
    return Part(found[0], name, writer.crc, writer.size)
