"""Hostile entries in ``save_path/control/requests/``: names of any bytes a Linux file name can
hold, entries of every type, floods of thousands.

Each time, in a real run (``aprof.Profiler`` and ``aprof.BlockingProfiler``, a recording target):
no step, ``capture`` or profiler call raises; every entry is answered (a request name) or moved
to ``control/rejected/``, once, so the folder is left empty; nothing outside ``save_path``
changes (links planted there point outside); the manifest loads with every window final; and a
valid request placed behind a flood of 6,000 entries is answered within two step boundaries.

The run's disk thread reads the folder as a step ends; the tests wait for that read (the thread
is the profiler's one disk worker) so that each boundary decides what the last read found.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import aprof
from aprof._control import ControlFolder, folder
from aprof._control.folder import FolderRead
from aprof._control.messages import REQUEST_ID, CaptureRequest
from aprof.testing import RecordingTarget
from faults.common import check_outside, check_windows, load, snapshot
from faults.tally import Faults

pytestmark = pytest.mark.faults

KINDS = (
    "request",
    "garbage",
    "empty_dir",
    "full_dir",
    "link_out",
    "link_dir_out",
    "dangling",
    "fifo",
    "socket",
    "unreadable",
)
"""What an entry is: a valid request, garbage, folders, links out of save_path, special files,
a file of mode 000."""
NAMES = (
    "é.json".encode(),
    "éé".encode(),
    b"\xff\xfe",
    b"\xff.json",
    b"bad\nname.json",
    b"...",
    b"..json",
    b".hidden.json",
    b"x" * 255,
    b"r" * 250 + b".json",
    b" ",
    b"-",
    b"ok-id.json",
    b".aprof-half.json.host.1.0123456789abcdef.aprof-tmp",
)
"""Names with no path-safe character, not UTF-8, with a newline, only dots, 255 bytes, too long
an id, dot-files, a valid request name, a temporary file's name."""
STEPS = 6
RUN_S = 120.0


def plant(requests: int, name: bytes, kind: str, outside: Path) -> None:
    """Entry ``name`` of ``kind`` in the folder ``requests`` (a descriptor)."""
    if kind in ("request", "garbage", "unreadable"):
        stem = name.removesuffix(b".json").decode(errors="replace")
        request = {"id": stem if REQUEST_ID.fullmatch(stem) else "other", "next": 1}
        data = json.dumps(request).encode() if kind == "request" else b"\x00\xff{not json"
        fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=requests)
        os.write(fd, data)
        os.close(fd)
        if kind == "unreadable":
            os.chmod(name, 0, dir_fd=requests)
    elif kind in ("empty_dir", "full_dir"):
        os.mkdir(name, dir_fd=requests)
        if kind == "full_dir":
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=requests)
            os.close(os.open(b"inside", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=inner))
            os.close(inner)
    elif kind == "link_out":
        os.symlink(outside / "target.json", name, dir_fd=requests)
    elif kind == "link_dir_out":
        os.symlink(outside, name, dir_fd=requests)
    elif kind == "dangling":
        os.symlink(outside / "nothing-here", name, dir_fd=requests)
    elif kind == "fifo":
        os.mkfifo(name, dir_fd=requests)
    else:
        os.mknod(name, 0o600 | stat.S_IFSOCK, dir_fd=requests)


@contextmanager
def requests_folder(save: Path) -> Iterator[int]:
    path = save / "control" / "requests"
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def make_outside(root: Path) -> Path:
    outside = root / "outside"
    outside.mkdir()
    (outside / "target.json").write_text(json.dumps({"id": "linked", "next": 1}))
    return outside


def config(save: Path) -> dict[str, Any]:
    return {
        "global_profiler": {"steps": [], "save_path": str(save), "wait_for_stops": True},
        "timeouts": {"connect_s": 1, "start_s": 2, "stop_s": 10, "poll_s": 0.01},
        "log": {"level": "warning"},
    }


def request_ids(names: list[bytes]) -> set[str]:
    """The ids the entries named ``names`` are answered under: those of request names."""
    stems = (n.removesuffix(b".json") for n in names if n.endswith(b".json"))
    return {s.decode() for s in stems if REQUEST_ID.fullmatch(s.decode(errors="replace"))}


def check_answered(save: Path, entries: list[tuple[bytes, str]], reads: list[FolderRead]) -> None:
    """Every request entry answered once, the folder left empty, the rest moved aside."""
    assert os.listdir(save / "control" / "requests") == []
    ids = request_ids([name for name, _ in entries])
    answered = [item.id for read in reads for item in read.incoming]
    assert sorted(answered) == sorted(ids)
    for request_id in ids:
        assert ControlFolder(save).answer(request_id) is not None
    # Answered folders are moved rather than removed, as is every entry of another name.
    folders = [n for n, k in entries if k in ("empty_dir", "full_dir") and request_ids([n])]
    rejected = save / "control" / "rejected"
    moved = len(os.listdir(rejected)) if rejected.exists() else 0
    assert moved == len(entries) - len(ids) + len(folders)
    assert moved == sum(len(read.set_aside) for read in reads)
    assert not any(read.stuck for read in reads)


def plant_all(save: Path, entries: list[tuple[bytes, str]], outside: Path) -> None:
    with requests_folder(save) as requests:
        for name, kind in entries:
            plant(requests, name, kind, outside)


async def disk_idle(prof: aprof.Profiler) -> None:
    """The profiler's disk thread has finished what it was given (its folder read too)."""
    await asyncio.wrap_future(prof._disk.submit(lambda: None))


async def run_async(faults: Faults, save: Path) -> aprof.Profiler:
    """Steps 1-6 with a request and a capture inside each; a call that raises escaped."""
    prof = aprof.Profiler(config(save))
    prof.add_target(RecordingTarget("replica_0", replica=0))
    try:
        async with asyncio.timeout(RUN_S), prof:
            for n in range(1, STEPS + 1):
                try:
                    async with prof.step(n), prof.request(replica=0):
                        prof.capture(next=1)
                except Exception as exc:
                    faults.check("escaped", False, f"step {n}: {type(exc).__name__}: {exc}")
                else:
                    faults.check("escaped", True, "")
                await disk_idle(prof)
    except Exception as exc:
        faults.check("escaped", False, f"profiler: {type(exc).__name__}: {exc}")
    return prof


def run_blocking(faults: Faults, save: Path) -> None:
    """:func:`run_async` through ``BlockingProfiler``."""
    try:
        with aprof.BlockingProfiler(config(save)) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))
            for n in range(1, STEPS + 1):
                try:
                    with prof.step(n):
                        prof.capture(next=1)
                except Exception as exc:
                    faults.check("escaped", False, f"step {n}: {type(exc).__name__}: {exc}")
                else:
                    faults.check("escaped", True, "")
                prof._profiler._disk.submit(lambda: None).result(timeout=RUN_S)
    except Exception as exc:
        faults.check("escaped", False, f"blocking profiler: {type(exc).__name__}: {exc}")


@pytest.fixture(autouse=True)
def dot_files_go_at_the_second_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dot-file seen at an earlier read is left behind (the run's bound is a minute)."""
    monkeypatch.setattr(folder, "WRITE_S", 0.0)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[FolderRead]:
    """What every read of a control folder found and did, in order."""
    found: list[FolderRead] = []
    take = ControlFolder.take

    def recorded(self: ControlFolder) -> FolderRead:
        read = take(self)
        found.append(read)
        return read

    monkeypatch.setattr(ControlFolder, "take", recorded)
    return found


@pytest.mark.parametrize("kind", KINDS)
async def test_hostile_entries_in_a_run(
    tmp_path: Path, faults: Faults, reads: list[FolderRead], kind: str
) -> None:
    """Every hostile name as an entry of ``kind``, present when the run opens."""
    save = tmp_path / "profile"
    outside = make_outside(tmp_path)
    before = snapshot(tmp_path, exclude=[save])
    entries = [(name, kind) for name in NAMES]
    plant_all(save, entries, outside)
    faults.count("control_entries", len(entries))
    await run_async(faults, save)
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    check_windows(faults, load(faults, save))
    check_answered(save, entries, reads)
    faults.assert_nothing_lost()


def test_hostile_entries_in_a_blocking_run(
    tmp_path: Path, faults: Faults, reads: list[FolderRead]
) -> None:
    """Every hostile name, each as another kind, under ``BlockingProfiler``."""
    save = tmp_path / "profile"
    outside = make_outside(tmp_path)
    before = snapshot(tmp_path, exclude=[save])
    entries = [(name, KINDS[i % len(KINDS)]) for i, name in enumerate(NAMES)]
    plant_all(save, entries, outside)
    faults.count("control_entries", len(entries))
    run_blocking(faults, save)
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    check_windows(faults, load(faults, save))
    check_answered(save, entries, reads)
    faults.assert_nothing_lost()


names = st.binary(min_size=1, max_size=255).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
) | st.sampled_from(NAMES)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(names, st.sampled_from(KINDS)), min_size=1, max_size=6, unique_by=lambda e: e[0]
    )
)
def test_generated_entries(
    faults: Faults, reads: list[FolderRead], entries: list[tuple[bytes, str]]
) -> None:
    """Entries of any name (any bytes but '/' and NUL) and kind: nothing raises, each is
    answered or set aside once, nothing outside changes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save = root / "profile"
        outside = make_outside(root)
        before = snapshot(root, exclude=[save])
        plant_all(save, entries, outside)
        faults.count("control_entries", len(entries))
        reads.clear()
        run_blocking(faults, save)
        check_outside(faults, before, snapshot(root, exclude=[save]))
        check_windows(faults, load(faults, save))
        check_answered(save, entries, reads)
    faults.assert_nothing_lost()


FLOOD = 1000
"""Entries of each kind in the flood."""


def flood(save: Path, outside: Path, n: int) -> int:
    """``n`` entries of each kind the channel cannot take as a request, mixed: folders named
    ``*.json`` holding a file, dot-files, links, FIFOs, sockets named ``*.json``, misnamed
    files. Returns how many."""
    kinds = [("full_dir", b"d"), ("garbage", b".w"), ("link_out", b"l"), ("fifo", b"f")]
    kinds += [("socket", b"s"), ("garbage", b"misnamed ")]
    with requests_folder(save) as requests:
        for i in range(n):
            for kind, prefix in kinds:
                plant(requests, prefix + b"%d.json" % i, kind, outside)
    return n * len(kinds)


async def test_a_request_behind_a_flood_is_answered_within_two_boundaries(
    tmp_path: Path, faults: Faults, reads: list[FolderRead]
) -> None:
    """A request placed after 6,000 entries the channel cannot take is answered at the first
    step boundary after a read (two at most); each read of the flooded folder stays bounded."""
    save = tmp_path / "profile"
    outside = make_outside(tmp_path)
    before = snapshot(tmp_path, exclude=[save])
    prof = aprof.Profiler(config(save))
    prof.add_target(RecordingTarget("replica_0", replica=0))
    answered_at: int | None = None
    async with asyncio.timeout(RUN_S), prof:
        async with prof.step(1):
            await disk_idle(prof)
            loop = asyncio.get_running_loop()
            planted = await loop.run_in_executor(None, flood, save, outside, FLOOD)
            faults.count("control_entries", planted)
            ControlFolder(save).submit(CaptureRequest(id="wanted", next=1))
        for n in (2, 3):
            await disk_idle(prof)
            async with prof.step(n):
                await prof.flush()
                if answered_at is None and ControlFolder(save).answer("wanted"):
                    answered_at = n
    # The read at step 1's end (waited for) took it: step 2's boundary decided it. A read
    # already under way as a request lands can miss it; the next one takes it: two at most.
    assert answered_at == 2, "not answered at the first boundary after a read"
    answer = ControlFolder(save).answer("wanted")
    assert answer is not None and answer.accepted and answer.steps == [2]
    for read in reads:
        assert len(read.incoming) <= folder.TAKEN_PER_BOUNDARY
        assert len(read.set_aside) <= folder.SET_ASIDE_PER_BOUNDARY + folder.TAKEN_PER_BOUNDARY
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    check_windows(faults, load(faults, save))
    faults.assert_nothing_lost()


async def test_a_flood_drains_and_each_entry_is_told_once(
    tmp_path: Path, faults: Faults, reads: list[FolderRead]
) -> None:
    """A smaller flood, read after read without a step between: it drains into
    ``control/rejected/`` (the request names answered first) and nothing is told twice."""
    save = tmp_path / "profile"
    outside = make_outside(tmp_path)
    before = snapshot(tmp_path, exclude=[save])
    n = FLOOD // 10
    planted = flood(save, outside, n)
    faults.count("control_entries", planted)
    control = ControlFolder(save)
    with ThreadPoolExecutor(1) as thread:
        for _ in range(planted):  # bounded: each read but the last answers or moves some
            read = await asyncio.wrap_future(thread.submit(control.take))
            if not read.incoming and not read.set_aside:
                break
    assert os.listdir(save / "control" / "requests") == []
    answered = [item.id for read in reads for item in read.incoming]
    assert len(answered) == len(set(answered)) == 4 * n  # d, l, f, s: request names
    assert sum(len(read.set_aside) for read in reads) == 3 * n  # dot, misnamed; folders too
    assert not any(read.stuck for read in reads)
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    faults.assert_nothing_lost()
