"""The merge's worker processes (``aprof._merge.parallel``): the shares of a step taken from
both ends, each exactly once, and a worker's part file the same text the merging process makes
of that input."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import aprof
from aprof._merge import parallel
from aprof._merge import scratch as scratch_module
from aprof._merge.flows import Links
from aprof._merge.placing import Input, Scope, place
from aprof._merge.scratch import Scratch
from aprof._merge.step_trace import _inputs
from aprof._traces.files import is_trace_json


class SharesTakenFromBothEnds(RuleBasedStateMachine):
    """The merging process takes the step's captures in order, workers take the last one
    left, in any interleaving, and the step may be left early: each capture is placed by
    exactly one of them, the merging process never skips one, and what a worker took and
    the merging process did not reach is handed back by ``close``."""

    def __init__(self) -> None:
        super().__init__()
        self.items = [Input(f"t{n}", "t", 2, number=n) for n in range(6)]
        self.shares = parallel.Shares(self.items)
        self.next = 0  # the merging process's place in the order
        self.by_worker: set[int] = set()
        self.here: set[int] = set()
        self.received: set[int] = set()  # worker results the merging process waited for
        self.closed = False

    @precondition(lambda self: not self.closed and self.next < len(self.items))
    @rule()
    def merging_process_takes_the_next(self) -> None:
        item = self.items[self.next]
        future = self.shares.take(item)
        if future is None:
            assert item.number not in self.by_worker
            self.here.add(item.number)
        else:
            assert item.number in self.by_worker
            self.received.add(item.number)
        self.next += 1

    @rule()
    def a_worker_takes_the_last(self) -> None:
        taken = self.shares.take_last()
        if self.closed:
            assert taken is None
            return
        if taken is None:
            assert all(n in self.here | self.by_worker for n in range(self.next, 6))
            return
        item, _ = taken
        assert item.number not in self.here | self.by_worker
        assert item.number >= self.next  # never one the merging process has passed
        self.by_worker.add(item.number)

    @precondition(lambda self: not self.closed)
    @rule(leave_early=st.booleans())
    def the_step_ends(self, leave_early: bool) -> None:
        if not leave_early:
            while self.next < len(self.items):
                self.merging_process_takes_the_next()
        left = self.shares.close()
        assert set(left) == self.by_worker - self.received
        self.closed = True

    @invariant()
    def each_once(self) -> None:
        assert not self.here & self.by_worker
        if self.closed and self.next == len(self.items):
            assert self.here | self.by_worker == set(range(6))


TestSharesTakenFromBothEnds = SharesTakenFromBothEnds.TestCase


@pytest.fixture
def demo(demo_run: Path) -> Path:
    return demo_run


def test_a_worker_places_each_share_as_the_merging_process_would(
    demo: Path, tmp_path: Path
) -> None:
    """A real worker process takes every capture of the step (the merging process takes
    none): each part file holds, compressed, the text ``place`` gives for that input here; an
    input whose part file cannot be written is handed back as failed, and the worker goes on
    with the next."""
    manifest = aprof.load_manifest(demo)
    base_ns = manifest.clock.wall_ns
    captures = [
        item
        for item in _inputs(manifest, 1)
        if is_trace_json(item.path) and item.timeline_process is None
    ]
    assert len(captures) >= 3
    blocked = captures[1]
    out = tmp_path / "out"
    out.mkdir()
    folder = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    scratch = Scratch(folder)
    shares = parallel.Shares(captures)
    workers = parallel.Workers(1, scratch)
    try:
        (pid,) = [w.process.pid for w in workers._workers]
        # Its part file cannot be written: a folder is there.
        (out / scratch.name / parallel.part_name(1, blocked, pid)).mkdir()
        for serving in workers.serve(shares, demo, 1, base_ns):
            serving.result(timeout=120)
        futures = {item.number: shares.take(item) for item in captures}
        assert all(future is not None for future in futures.values())  # all the worker's
        for item in captures:
            future = futures[item.number]
            assert future is not None
            if item is blocked:
                with pytest.raises(RuntimeError, match="merge worker"):
                    future.result()
                continue
            part = future.result()
            assert part.name == parallel.part_name(1, item, pid)  # whose it is, by its name
            here = place(demo, 1, item, base_ns, Scope(), Links())
            text = b",".join(_all(here))
            compressed = b"".join(workers.read_part(part))
            assert zlib.decompressobj(-15).decompress(compressed) == text  # no final block
            assert (part.crc, part.size) == (zlib.crc32(text), len(text))
            assert part.placed.events > 0
        left = sorted(p.name for p in (out / scratch.name).iterdir())
        assert left == sorted([scratch_module.LOCK, parallel.part_name(1, blocked, pid)])
        (out / scratch.name / parallel.part_name(1, blocked, pid)).rmdir()  # the test's own
    finally:
        workers.close()
        scratch.close()
        os.close(folder)
    assert list(out.iterdir()) == []  # the merge's folder, gone with what it held


def _all(pieces: object) -> list[bytes]:
    found = []
    while True:
        try:
            found.append(next(pieces))  # type: ignore[call-overload]
        except StopIteration:
            return found
