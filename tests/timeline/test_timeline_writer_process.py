"""The writer process: the recording process hands it the events and it writes the files. One
serves every profiler of an interpreter and ends with it; one that dies costs its timelines
only; where none can start, the writer thread writes the same file; attribute values marshal
does not take are written as the thread would write them."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from timeline_rules import (
    check_trace,
    driver,
    ended_within,
    load_trace,
    timeline_file,
    writer_processes,
)

import aprof
from aprof._timeline import writer_process as _writer_process
from aprof._timeline.writer_process import WriterProcess
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]


def spans(save_path: Path) -> dict[str, dict[str, object]]:
    """The args of each top-level span of the run's timeline, by name."""
    roots = check_trace(load_trace(timeline_file(save_path)))
    return {r.name: r.args for r in roots if r.cat == "span"}


@contextlib.contextmanager
def stopped_writer_process() -> Iterator[None]:
    """Hold this interpreter's writer process with SIGSTOP during the block, then check that
    the block got it killed (it ends within 30 s)."""
    [pid] = writer_processes(os.getpid())
    writer = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGSTOP)
        yield
        assert ended_within([writer], 30)
    finally:
        os.close(writer)


TWO_PROFILERS = """
import asyncio, sys
import aprof

async def run(save, name):
    cfg = {"global_profiler": {"save_path": save}, "log": {"level": "error"}}
    async with aprof.Profiler(cfg) as prof:
        with prof.span(name):
            pass
        await prof.flush()
        return prof

async def main(first, second):
    await asyncio.gather(run(first, "first"), run(second, "second"))
    print("CLOSED", flush=True)
    sys.stdin.read()  # until the test closes it

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_one_writer_process_serves_the_interpreter_and_ends_with_it(tmp_path: Path) -> None:
    """Two profilers of one process write through one writer process; it outlives their
    close (the next profiler needs no new one) and ends when the process exits."""
    first, second = tmp_path / "first", tmp_path / "second"
    script = tmp_path / "driver.py"
    with driver(script, TWO_PROFILERS, str(first), str(second), says=b"CLOSED") as (proc, writers):
        assert len(writers) == 1
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        assert ended_within(writers, 30)
    assert list(spans(first)) == ["first"]
    assert list(spans(second)) == ["second"]


FORKING = """
import asyncio, os, sys
import aprof

async def main(save):
    cfg = {"global_profiler": {"save_path": save}, "log": {"level": "error"}}
    async with aprof.Profiler(cfg) as prof:
        with prof.span("before the fork"):
            pass
        await prof.flush()
    if os.fork() == 0:  # a worker that outlives the recording process
        sys.stdin.read()
        os._exit(0)
    print("FORKED", flush=True)
    sys.stdin.read()  # alive until the test kills it: exiting would end the writer process

asyncio.run(main(sys.argv[1]))
"""


def test_a_fork_does_not_keep_the_writer_process_alive(tmp_path: Path) -> None:
    """The writer process ends with the recording process even while a fork of it lives on
    (the fork's copies of the pipes are let go at the fork)."""
    script, save = tmp_path / "driver.py", tmp_path / "profile"
    with driver(script, FORKING, str(save), says=b"FORKED") as (proc, writers):
        assert len(writers) == 1
        proc.send_signal(signal.SIGKILL)  # the fork, reading the same stdin, lives on
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert ended_within(writers, 30)
    assert list(spans(tmp_path / "profile")) == ["before the fork"]


async def test_a_writer_process_that_dies_costs_its_timelines_only(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Killed after a write: later writes of that timeline fail and are logged, the file stays
    that write, the manifest describes it, the run and its windows go on; the next profiler
    gets a new writer process."""
    async with aprof.Profiler(make_config()) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        with prof.span("written"):
            pass
        await prof.flush()
        [pid] = writer_processes(os.getpid())
        writer = os.pidfd_open(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            assert ended_within([writer], 30)
        finally:
            os.close(writer)
        async with prof.step(1), prof.request(replica=0) as req, prof.span("lost"):
            assert req.captured
        await prof.flush()
    assert "timeline write failed" in capsys.readouterr().err
    assert list(spans(prof.save_path)) == ["written"]
    manifest = aprof.load_manifest(prof.save_path)
    assert [w.state for w in manifest.windows] == ["done"]
    assert [(e.events, e.bytes) for e in manifest.timeline] == [
        (1, timeline_file(prof.save_path).stat().st_size)
    ]
    cfg = make_config(global_profiler={"save_path": str(tmp_path / "next")})
    async with aprof.Profiler(cfg) as after:
        with after.span("next"):
            pass
    assert list(spans(after.save_path)) == ["next"]
    assert [p for p in writer_processes(os.getpid()) if p != pid]


async def test_a_stuck_writer_process_is_killed_and_the_close_goes_on(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer process that stops answering (SIGSTOP stands in for a hung disk) is killed
    after the write bound: the write fails and is logged, the profiler closes, the file keeps
    its last write."""
    monkeypatch.setattr(_writer_process, "_WRITE_S", 0.5)
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("written"):
            pass
        await prof.flush()
        with stopped_writer_process():
            with prof.span("lost"):
                pass
            await prof.flush()
    assert "did not write within 0.5 s" in capsys.readouterr().err
    assert list(spans(prof.save_path)) == ["written"]


async def test_a_cancelled_flush_still_writes_what_it_took(make_config: MakeConfig) -> None:
    """A flush cancelled while its write waits behind another (the writer process is held
    with SIGSTOP meanwhile) is still written: its spans reach the file and are counted."""
    async with aprof.Profiler(make_config()) as prof:
        await prof.flush()  # the writer process exists from here on
        [pid] = writer_processes(os.getpid())
        waiting = asyncio.Event()

        async def cancelled_flush() -> None:
            with prof.span("taken by the cancelled flush"):
                pass
            waiting.set()
            await prof.flush()  # queued behind the held write below

        os.kill(pid, signal.SIGSTOP)
        try:
            held = asyncio.create_task(prof.flush())
            cancelled = asyncio.create_task(cancelled_flush())
            async with asyncio.timeout(30):
                await waiting.wait()
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
        finally:
            os.kill(pid, signal.SIGCONT)
        async with asyncio.timeout(30):
            await held
            await prof.flush()
        assert prof.manifest.timeline[0].events == 1
    assert list(spans(prof.save_path)) == ["taken by the cancelled flush"]


async def test_a_writer_process_that_takes_nothing_in_is_killed_and_the_close_goes_on(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped (SIGSTOP) while more spans than its pipe holds are sent to it: the send gives
    up after the bound and kills it; the profiler closes, the file keeps its last write."""
    monkeypatch.setattr(_writer_process, "_WRITE_S", 0.5)
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("written"):
            pass
        await prof.flush()
        with stopped_writer_process():
            for i in range(50_000):  # about 3 MB marshalled: more than its 1 MiB pipe holds
                with prof.span("lost", i=i):
                    pass
            await prof.flush()
    assert "took nothing in for 0.5 s" in capsys.readouterr().err
    assert list(spans(prof.save_path)) == ["written"]


@pytest.mark.parametrize(
    "executable",
    [str(Path(sys.executable).with_name("no-such-python")), shutil.which("true")],
    ids=["missing", "exits at once"],
)
async def test_without_a_writer_process_the_thread_writes_the_file(
    make_config: MakeConfig,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    executable: str,
) -> None:
    """An interpreter that cannot be started, or a program that never answers: logged, and
    the writer thread writes the file, in the same format, through the close."""
    monkeypatch.setattr(WriterProcess, "_shared", None)  # as if none had started yet
    monkeypatch.setattr(sys, "executable", executable)
    before = writer_processes(os.getpid())
    async with aprof.Profiler(make_config()) as prof:
        async with prof.step(1):
            with prof.span("turn", n=1):
                pass
        await prof.flush()
        with prof.span("after"):
            pass
    assert "timeline writer process failed to start" in capsys.readouterr().err
    assert writer_processes(os.getpid()) == before
    assert spans(prof.save_path) == {"turn": {"n": 1, "step": 1}, "after": {"step": None}}
    [entry] = aprof.load_manifest(prof.save_path).timeline
    assert entry.events == 3


class Level(enum.IntEnum):
    HIGH = 3


class Color(enum.StrEnum):
    RED = "red"


class Ratio(float):
    pass


async def test_values_marshal_does_not_take_are_written_as_their_plain_form(
    make_config: MakeConfig,
) -> None:
    """Enums, float subclasses and other objects reach the writer process as the values the
    file shows for them; the spans around them in the same write are unchanged."""
    async with aprof.Profiler(make_config()) as prof:
        with prof.span("plain", pair=(1, "a")):  # not an AttrValue: written as its str
            pass
        with prof.span(
            "other",
            level=Level.HIGH,
            color=Color.RED,
            ratio=Ratio(0.5),
            where=Path("/x"),
            pair=(1, "a"),
        ):
            pass
    assert spans(prof.save_path) == {
        "plain": {"pair": "(1, 'a')", "step": None},
        "other": {
            "level": 3,
            "color": "red",
            "ratio": 0.5,
            "where": "/x",
            "pair": "(1, 'a')",
            "step": None,
        },
    }
