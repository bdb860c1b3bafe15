"""Killed merge workers and merges, and exports to hostile endpoints.

- A merge worker SIGKILLed while it writes its share: the merge completes (the merging
  process places that capture itself) and leaves no file of the worker's, nor of its own.
- A merge SIGKILLed with its worker: the next merge removes what they left; a folder of a
  merge still running in another process, and anything behind a link, are left alone.
- ``aprof export otlp`` to an endpoint that trickles its answer, to a closed port and to an
  ``ftp://`` URL, with credentials in the URL: one line, exit 1, within the deadline, and the
  password in no line.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gzip
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import aprof
from aprof._merge.scratch import LOCK, PREFIX, Scratch
from aprof.testing import RecordingTarget
from faults.common import check_outside, snapshot
from faults.tally import Faults
from servers.process import free_port

pytestmark = pytest.mark.faults

MakeConfig = Callable[..., aprof.ProfilerConfig]
ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 120
"""The bound of every wait here: generous, these tests assert behaviour, not speed."""
EVENTS = 300_000
"""Events per capture: enough that placing one takes a worker a while (a few seconds)."""
PART = re.compile(r"\.step_(\d+)\.part(\d+)\.(\d+)\.deflate")


async def _run(make_config: MakeConfig) -> Path:
    """A run whose step 1 has two captures, each a large Kineto-style trace."""
    cfg = make_config(
        global_profiler={"steps": [1]},
        rollout={"replicas": "all", "start": "on_step", "forward_steps": None},
    )
    async with aprof.Profiler(cfg) as prof:
        for r in (0, 1):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
        async with prof.step(1):
            pass
    manifest = aprof.load_manifest(prof.save_path)
    base = manifest.clock.wall_ns
    for window in manifest.windows:
        for entry in window.files:
            events = [
                {"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": n, "dur": 1}
                for n in range(EVENTS)
            ]
            doc = {"baseTimeNanoseconds": base, "traceEvents": events}
            (prof.save_path / entry.path).write_text(json.dumps(doc))
    return prof.save_path


async def _merge(save_path: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aprof",
        "merge",
        str(save_path),
        "--jobs",
        "2",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _first_part(merged: Path, merge: asyncio.subprocess.Process) -> tuple[int, Path] | None:
    """The worker pid and file of the first part file a worker of ``merge`` writes (polled:
    the file's appearance is the event), ``None`` if the merge ends first."""
    async with asyncio.timeout(LIMIT_S):
        while merge.returncode is None:
            found = await asyncio.to_thread(_part_in, merged)
            if found is not None:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(merge.wait()), 0.005)
    return None


def _part_in(merged: Path) -> tuple[int, Path] | None:
    for folder in merged.glob(f"{PREFIX}*"):
        for path in folder.iterdir():
            found = PART.fullmatch(path.name)
            if found:
                return int(found[3]), path
    return None


def _leftovers(save_path: Path) -> list[str]:
    """What a merge may write before it is whole, left below ``save_path``."""
    return sorted(
        str(p.relative_to(save_path))
        for p in save_path.rglob("*")
        if p.name.startswith(PREFIX) or p.name.endswith(".aprof-tmp") or PART.fullmatch(p.name)
    )


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # done already: its share was whole
        return False
    return True


async def test_a_worker_killed_mid_share_leaves_nothing_and_costs_no_capture(
    make_config: MakeConfig, tmp_path: Path, faults: Faults
) -> None:
    save_path = await _run(make_config)
    before = snapshot(tmp_path, exclude=[save_path])
    merge = await _merge(save_path)
    found = await _first_part(save_path / "merged", merge)
    assert found is not None, "no worker took a share"
    pid, _ = found
    faults.count("merge_kills", int(_kill(pid)))
    async with asyncio.timeout(LIMIT_S):
        _, err = await merge.communicate()
    faults.check("escaped", merge.returncode == 0, err.decode()[-2000:])
    faults.check("unloadable", _leftovers(save_path) == [], f"left: {_leftovers(save_path)}")
    with gzip.open(save_path / "merged" / "step_1.trace.json.gz", "rt") as f:
        doc = json.load(f)
    kernels = sum(e.get("name") == "k" for e in doc["traceEvents"])
    faults.check("unloadable", kernels == 2 * EVENTS, f"{kernels} of {2 * EVENTS} events merged")
    check_outside(faults, before, snapshot(tmp_path, exclude=[save_path]))
    faults.assert_nothing_lost()


async def test_the_next_merge_removes_what_a_killed_merge_left_and_nothing_else(
    make_config: MakeConfig, tmp_path: Path, faults: Faults
) -> None:
    save_path = await _run(make_config)
    merged = save_path / "merged"
    merged.mkdir()
    # Beside it: a merge running in this process (its folder locked), and a link named as
    # a merge's folder leading outside save_path.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not aprof's")
    (merged / f"{PREFIX}1.{'0' * 16}").symlink_to(outside)
    faults.count("links")
    folder = os.open(merged, os.O_RDONLY | os.O_DIRECTORY)
    live = Scratch(folder)
    (merged / live.name / "part").write_text("still being written")
    before = snapshot(tmp_path, exclude=[save_path])
    try:
        merge = await _merge(save_path)
        found = await _first_part(merged, merge)
        assert found is not None, "no worker took a share"
        pid, part = found
        killed = _kill(merge.pid) + _kill(pid)
        faults.count("merge_kills", killed)
        async with asyncio.timeout(LIMIT_S):
            await merge.wait()
        left = part.parent
        await _released(left / LOCK)  # the kernel lets go of the lock once both are gone
        again = await _merge(save_path)
        async with asyncio.timeout(LIMIT_S):
            _, err = await again.communicate()
        faults.check("escaped", again.returncode == 0, err.decode()[-2000:])
        faults.check("unloadable", not left.exists(), f"{left.name} left by a killed merge")
        kept = (merged / live.name / "part").exists()
        faults.check("unloadable", kept, "the folder of a merge still running was removed")
        check_outside(faults, before, snapshot(tmp_path, exclude=[save_path]))
    finally:
        live.close()
        os.close(folder)
    faults.check("unloadable", _leftovers(save_path) == [f"merged/{PREFIX}1.{'0' * 16}"], "")
    faults.assert_nothing_lost()


async def _released(lock: Path) -> None:
    """Until nothing holds ``lock`` (or it is gone)."""
    async with asyncio.timeout(LIMIT_S):
        while True:
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            finally:
                os.close(fd)  # lets go of it again, if taken
            await asyncio.sleep(0.01)  # a poll: a lock has no event to wait on


@contextlib.asynccontextmanager
async def _trickling() -> AsyncIterator[int]:
    """An HTTP server on 127.0.0.1 that reads a request, then sends its answer's head a
    byte every 0.2 s, for ever; its port."""

    clients: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        clients.add(writer)
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n")
            while True:
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.2)  # the endpoint's own pace, not a synchronization

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in clients:  # its handlers end on the closed connection
            writer.close()


async def _export(save_path: Path, endpoint: str) -> tuple[int | None, list[str]]:
    """``aprof export otlp --timeout 1`` as a process: its exit code and every line it wrote."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aprof",
        "export",
        "otlp",
        str(save_path),
        "--endpoint",
        endpoint,
        "--timeout",
        "1",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(30):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode, (out + err).decode().splitlines()


async def test_an_export_is_bounded_and_never_shows_the_password(
    make_config: MakeConfig, faults: Faults
) -> None:
    cfg = make_config(global_profiler={"steps": [1]}, rollout={"forward_steps": None})
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with prof.step(1), prof.request(replica=0, request_id="r1"):
            pass
    closed = f"http://user:secret@127.0.0.1:{free_port()}"
    async with _trickling() as port:
        cases = {
            "trickling": (f"http://user:secret@127.0.0.1:{port}", "within 1 s"),
            "closed": (closed, "did not take"),
            "ftp": ("ftp://user:secret@127.0.0.1/v1/traces", "ftp:// is not supported"),
        }
        for case, (endpoint, said) in cases.items():
            faults.count("exports")
            try:
                code, lines = await _export(prof.save_path, endpoint)
            except TimeoutError:
                faults.check("escaped", False, f"{case}: still running after 30 s")
                continue
            shown = [line for line in lines if line.strip()]
            one = len(shown) == 1 and shown[0].startswith("aprof export: ") and said in shown[0]
            faults.check("escaped", code == 1 and one, f"{case}: exit {code}: {lines}")
            leaked = [line for line in lines if "secret" in line]
            faults.check("escaped", not leaked, f"{case}: the password shown: {leaked}")
    assert "http:// or https://" in shown[0]  # the last, ftp: what is supported
    faults.assert_nothing_lost()
