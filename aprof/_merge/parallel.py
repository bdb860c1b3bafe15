"""The captures of one step placed by worker processes, when more than one core is free: each
worker places one input at a time (``placing.place``) into a part file of the output folder,
compressed as a part of the merged file's gzip stream (``gzip_stream.py``), which the merging
process then lays into the merged file as it is, in the inputs' order, and removes. Numbers
an input gets depend on its place alone (``placing.py``): the merged file holds the same text
as one process makes.

A worker is a ``python -m aprof._merge`` process that reads one task per line on its standard
input and answers each with a line on its standard output; :class:`Workers` keeps up to
``jobs`` of them, one per thread that waits on it. Not ``multiprocessing``: its workers would
run the caller's main module again when it has no ``if __name__ == "__main__"`` guard. A
worker that fails, or dies, costs nothing but time: the merging process places that input
itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Final, NamedTuple

from aprof._merge.archive import ArchiveFile
from aprof._merge.flows import ForwardStep, Links
from aprof._merge.gzip_stream import PartWriter
from aprof._merge.placing import Input, Placed, Scope, place
from aprof._safe_files import open_folder, replace_file
from aprof._traces.stream import blocks

WORTH_BYTES: Final = 16 << 20
"""Captures of a step (on disk, gzip: ten to twenty times as much JSON) below which one
process merges them sooner than workers start (each takes about half a second to import
aprof; ``benchmarks/bench_merge.py``: slower with workers at 100 MB of JSON, faster at 1 GB)."""


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Part(NamedTuple):
    """What a worker placed: its result, and the CRC-32 and length of the text its part file
    holds (compressed)."""

    placed: Placed
    crc: int
    size: int


class Workers:
    """Up to ``jobs`` worker processes, started as they are needed, stopped by :meth:`close`."""

    def __init__(self, jobs: int) -> None:
        self._threads = ThreadPoolExecutor(jobs, thread_name_prefix="aprof-merge")
        self._mine = threading.local()
        self._started: list[subprocess.Popen[str]] = []
        self._lock = threading.Lock()

    def submit(
        self, where: tuple[str, list[str]], root: Path, step: int, item: Input, base_ns: int
    ) -> Future[Part]:
        """Place ``item`` in a worker process, into its part file below ``where``."""
        task = {
            "where": where,
            "root": str(root),
            "step": step,
            "item": dataclasses.asdict(item),
            "base_ns": base_ns,
        }
        return self._threads.submit(self._run, json.dumps(task))

    def close(self) -> None:
        """Stop taking tasks, let the workers end (each ends its task first), wait for them."""
        self._threads.shutdown(wait=True, cancel_futures=True)
        for worker in self._started:
            with contextlib.suppress(OSError):
                _stdin(worker).close()
            worker.wait()

    def _run(self, task: str) -> Part:
        """On a thread of the pool: ``task`` by this thread's worker (started if need be)."""
        worker: subprocess.Popen[str] | None = getattr(self._mine, "worker", None)
        if worker is None or worker.poll() is not None:
            worker = subprocess.Popen(
                [sys.executable, "-m", "aprof._merge"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self._mine.worker = worker
            with self._lock:
                self._started.append(worker)
        _stdin(worker).write(task + "\n")
        _stdin(worker).flush()
        line = _stdout(worker).readline()
        if not line:
            raise RuntimeError(f"merge worker ended with {worker.wait()}")
        return _part(json.loads(line))


def serve() -> None:
    """A worker: place each input its standard input names, answering each on its standard
    output (which nothing else writes to: print and logs go to standard error), until its
    standard input ends."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    for line in sys.stdin:
        task = json.loads(line)
        try:
            where = (task["where"][0], list(task["where"][1]))
            item = Input(**task["item"])
            root, step, base_ns = Path(task["root"]), task["step"], task["base_ns"]
            answer = _answer(_place_into_part(where, root, step, item, base_ns))
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


def part_name(step: int, item: Input) -> str:
    """The part file of ``item`` in the output folder while the step is merged."""
    return f".step_{step}.part{item.number}.deflate"


def _part(found: dict[str, Any]) -> Part:
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
    return Part(placed, found["crc"], found["size"])


def _stdin(worker: subprocess.Popen[str]) -> IO[str]:
    assert worker.stdin is not None  # made with PIPE
    return worker.stdin


def _stdout(worker: subprocess.Popen[str]) -> IO[str]:
    assert worker.stdout is not None  # made with PIPE
    return worker.stdout


def read_part(where: tuple[str, list[str]], step: int, item: Input) -> Iterator[bytes]:
    """The bytes of ``item``'s part file (compressed), a chunk at a time; the file is removed
    after."""
    name = part_name(step, item)
    folder = open_folder(where[0], where[1], create=False)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        try:
            yield from blocks(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):  # gone already: nothing left behind
            os.unlink(name, dir_fd=folder)
        os.close(folder)


def remove_part(where: tuple[str, list[str]], step: int, item: Input) -> None:
    """Remove ``item``'s part file, if a worker left one."""
    try:
        folder = open_folder(where[0], where[1], create=False)
    except OSError:
        return
    try:
        os.unlink(part_name(step, item), dir_fd=folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def _place_into_part(
    where: tuple[str, list[str]], root: Path, step: int, item: Input, base_ns: int
) -> Part:
    """In a worker: place ``item``, its text (events joined by commas) into its part file."""
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

    folder = open_folder(where[0], where[1], create=True)
    try:
        replace_file(folder, part_name(step, item), compressed())
    finally:
        os.close(folder)
    return Part(found[0], writer.crc, writer.size)
