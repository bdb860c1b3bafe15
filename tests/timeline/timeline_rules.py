"""Read a timeline file back and check the Chrome trace rules Perfetto relies on.

Perfetto sorts events by ``ts``, ties kept in file order; async slices pair by process and
``id2.local``; ``X`` slices must not overlap on one thread. ``check_trace`` replays the events
that way and returns every async slice with its nested slices and instants.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import select
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Slice:
    """One async slice: its begin event's fields, its end, what nests inside."""

    name: str
    cat: str
    key: tuple[int, str]
    begin: float
    end: float = float("nan")
    args: dict[str, Any] = field(default_factory=dict)
    children: list[Slice] = field(default_factory=list)
    instants: list[dict[str, Any]] = field(default_factory=list)


def load_trace(path: Path) -> dict[str, Any]:
    """The parsed file; it must be one complete gzip stream of JSON."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert isinstance(data, dict)
    return data


def check_trace(data: dict[str, Any]) -> list[Slice]:
    """Assert the format rules; returns the top-level async slices (instants without a
    slice around them come back as zero-length slices)."""
    keys = list(data)
    # First, and not "ns": older Perfetto would then read every ts as nanoseconds.
    assert keys[0] == "displayTimeUnit" and data["displayTimeUnit"] == "ms"
    assert keys.index("baseTimeNanoseconds") < keys.index("traceEvents")
    assert keys.index("aprof") < keys.index("traceEvents")
    events = data["traceEvents"]
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    ordered = sorted(enumerate(events), key=lambda pair: (pair[1].get("ts", -1.0), pair[0]))
    stacks: dict[tuple[int, str], list[Slice]] = defaultdict(list)
    roots: list[Slice] = []
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for _, event in ordered:
        ph = event["ph"]
        if ph == "M":
            continue
        if ph == "X":
            by_thread[(event["pid"], event["tid"])].append(
                (event["ts"], event["ts"] + event["dur"])
            )
            continue
        assert ph in "ben", event
        for needed in ("cat", "name", "pid", "ts", "id2"):
            assert needed in event, (needed, event)
        key = (event["pid"], event["id2"]["local"])
        stack = stacks[key]
        if ph == "b":
            opened = Slice(
                event["name"], event["cat"], key, event["ts"], args=event.get("args", {})
            )
            (stack[-1].children if stack else roots).append(opened)
            stack.append(opened)
        elif ph == "e":
            assert stack, f"an 'e' with no open 'b': {event}"
            closing = stack.pop()
            assert closing.name == event["name"], (closing.name, event)
            closing.end = event["ts"]
        elif stack:
            stack[-1].instants.append(event)
        else:
            alone = Slice(event["name"], event["cat"], key, event["ts"], event["ts"])
            alone.args = event.get("args", {})
            roots.append(alone)
    unmatched = [s.name for stack in stacks.values() for s in stack]
    assert not unmatched, f"'b' without 'e': {unmatched}"
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (begin, _) in itertools.pairwise(spans):
            assert begin >= end, f"overlapping X slices on one thread: {spans}"
    assert_unique_ids(roots)
    return roots


def assert_unique_ids(roots: list[Slice]) -> None:
    """No two slices that are open at the same time share a (process, id)."""
    by_key: dict[tuple[int, str], list[Slice]] = defaultdict(list)
    for root in roots:
        by_key[root.key].append(root)
    for key, same in by_key.items():
        same.sort(key=lambda s: s.begin)
        for a, b in itertools.pairwise(same):
            assert b.begin >= a.end, f"id {key} shared by slices open together: {a}, {b}"


def most_open_at_once(slices: list[Slice]) -> int:
    """The largest number of ``slices`` open at one instant."""
    edges = sorted([(s.begin, 1) for s in slices] + [(s.end, -1) for s in slices])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def timeline_file(save_path: Path) -> Path:
    """The one timeline file under ``save_path``."""
    (path,) = (save_path / "timeline").glob("*.trace.json.gz")
    return path


def writer_processes(parent: int) -> list[int]:
    """The pids of the running timeline writer processes that ``parent`` started."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes()  # empty once it ended
        except OSError:  # not a process, or one that ended meanwhile
            continue
        if f"\nPPid:\t{parent}\n" in status and b"aprof._timeline.writer_child" in command:
            found.append(int(entry.name))
    return found


def ended_within(pidfds: list[int], timeout_s: float) -> bool:
    """Whether the processes of ``pidfds`` (``os.pidfd_open``) all end within ``timeout_s``."""
    waiting, until = set(pidfds), time.monotonic() + timeout_s
    while waiting:
        ready, _, _ = select.select(list(waiting), [], [], max(0.0, until - time.monotonic()))
        if not ready:
            return False
        waiting -= set(ready)
    return True


@contextlib.contextmanager
def driver(
    script: Path, source: str, *args: str, says: bytes
) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """Run ``source`` as ``script`` with ``args`` until it prints the line ``says``; yields the
    process and pidfds of the writer processes it started. Afterwards the process is killed
    if it still runs, its stdin closed (a fork of it reading stdin ends then) and all closed."""
    script.write_text(source)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    writers: list[int] = []
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else b""
        assert line == says + b"\n", proc.stderr.read() if proc.poll() is not None else line
        writers = [os.pidfd_open(pid) for pid in writer_processes(proc.pid)]
        yield proc, writers
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for fd in writers:
            os.close(fd)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
