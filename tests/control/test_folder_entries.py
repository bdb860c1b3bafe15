"""One read of ``control/requests/`` (``ControlFolder.take``): regular request files first,
bounded lists and moves, writes under way left alone until their bound, entries that can be
neither removed nor moved told once, and the run's status saying so once."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import aprof
from aprof._control import CaptureRequest, ControlFolder, folder
from aprof._safe_files import open_folder, replacing
from aprof.testing import RecordingTarget


@pytest.fixture
def requests(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "control" / "requests"
    path.mkdir(parents=True)
    return path


def _request(requests: Path, request_id: str) -> None:
    (requests / f"{request_id}.json").write_text(json.dumps({"id": request_id, "next": 1}))


def test_regular_request_files_are_read_before_entries_that_cannot_be(requests: Path) -> None:
    for i in range(3 * folder.TAKEN_PER_BOUNDARY):
        os.mkfifo(requests / f"f{i}.json")
    _request(requests, "wanted")
    read = ControlFolder(requests.parent.parent).take()
    assert read.incoming[0].id == "wanted" and read.incoming[0].request is not None
    assert len(read.incoming) == folder.TAKEN_PER_BOUNDARY
    assert all(item.error == "not a regular file: a FIFO" for item in read.incoming[1:])


def test_a_read_lists_and_moves_a_bounded_number_of_entries(
    requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(folder, "LISTED_PER_BOUNDARY", 10)
    monkeypatch.setattr(folder, "SET_ASIDE_PER_BOUNDARY", 3)
    for i in range(30):
        (requests / f"misnamed {i}").write_text("x")
    control = ControlFolder(requests.parent.parent)
    read = control.take()
    assert len(read.set_aside) == 3 and not read.incoming
    assert all("not named <id>.json" in line for line in read.set_aside)
    rejected = requests.parent / "rejected"
    assert len(os.listdir(rejected)) == 3 and len(os.listdir(requests)) == 27
    for _ in range(30):  # bounded: every read moves some
        assert len(control.take().set_aside) <= 3
    assert os.listdir(requests) == [] and len(os.listdir(rejected)) == 30
    assert sorted(p.read_text() for p in rejected.iterdir()) == ["x"] * 30  # moved, whole


def test_a_request_larger_than_the_bound_is_refused_unread(requests: Path) -> None:
    (requests / "big.json").write_bytes(b"{" + b" " * (10 << 20) + b"}")
    [item] = ControlFolder(requests.parent.parent).take().incoming
    assert item.request is None and item.error is not None and "larger than" in item.error
    assert os.listdir(requests) == []


def test_a_write_under_way_is_left_alone_until_its_bound(
    requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The atomic submit's own temporary file, read around while it is written, lands whole;
    a dot-file still there ``WRITE_S`` after it was first seen is moved aside."""
    control = ControlFolder(requests.parent.parent)
    fd = open_folder(str(requests), (), create=False)
    try:
        with replacing(fd, "mine.json") as out:
            out.write(b'{"id": "mine", ')
            for _ in range(3):
                read = control.take()
                assert not read.incoming and not read.set_aside
            out.write(b'"next": 2}')
    finally:
        os.close(fd)
    [item] = control.take().incoming
    assert item.request is not None and item.request.next == 2
    (requests / ".left-behind").write_text("half")
    monkeypatch.setattr(folder, "WRITE_S", 0.0)
    assert not control.take().set_aside  # first seen now
    [line] = control.take().set_aside
    assert line.startswith("'.left-behind' (file): a dot-file")
    assert os.listdir(requests) == []


def test_a_read_goes_on_where_the_last_one_stopped(
    requests: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More entries than one read lists, none of which can go (writes under way): a request
    made after them is still taken within two rounds of the listing."""
    monkeypatch.setattr(folder, "LISTED_PER_BOUNDARY", 10)
    for i in range(35):
        (requests / f".w{i}").write_text("under way")
    control = ControlFolder(requests.parent.parent)
    control.take()
    _request(requests, "wanted")
    taken_at = next(
        (n for n in range(1, 9) if [i.id for i in control.take().incoming] == ["wanted"]), None
    )
    assert taken_at is not None  # 36 entries: 4 reads a round, two rounds at most
    control.close()
    assert len(os.listdir(requests)) == 35


def test_what_can_be_neither_removed_nor_moved_is_told_once(requests: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (requests.parent / "rejected").symlink_to(elsewhere)
    (requests / "d.json").mkdir()
    (requests / "d.json" / "inside").write_text("kept")
    (requests / "bad name").write_text("kept")
    control = ControlFolder(requests.parent.parent)
    first = control.take()
    assert [item.id for item in first.incoming] == ["d"]
    assert len(first.stuck) == 2 and not first.set_aside
    assert all("cannot be moved" in line for line in first.stuck)
    again = control.take()
    assert not again.incoming and not again.stuck  # remembered: not looked at again
    _request(requests, "later")
    assert [item.id for item in control.take().incoming] == ["later"]
    assert os.listdir(elsewhere) == []  # nothing moved through the link
    # A new entry under a stuck one's name is a new entry.
    (requests / "d.json" / "inside").unlink()
    (requests / "d.json").rmdir()
    _request(requests, "d")
    [item] = control.take().incoming
    assert item.id == "d" and item.request is not None


async def test_the_status_tells_stuck_entries_once(
    make_config: Callable[..., aprof.ProfilerConfig],
) -> None:
    cfg = make_config(global_profiler={"steps": []})
    control = cfg.global_profiler.save_path / "control"
    (control / "requests" / "d.json").mkdir(parents=True)
    (control / "requests" / "d.json" / "inside").write_text("kept")
    (control / "rejected").write_text("not a folder")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        for n in range(1, 5):
            async with prof.step(n):
                await disk_idle(prof)
    said = [p for p in prof._control.status().problems if "neither read nor moved" in p]
    assert len(said) == 1 and "'d.json' (dir)" in said[0], said
    answer = ControlFolder(cfg.global_profiler.save_path).answer("d")
    assert answer is not None and answer.reason == "not a regular file: a directory"


async def disk_idle(prof: aprof.Profiler) -> None:
    """The profiler's disk thread has done what it was given (the folder's read too)."""
    await asyncio.wrap_future(prof._disk.submit(lambda: None))


def test_an_unread_request_can_still_be_withdrawn(requests: Path) -> None:
    control = ControlFolder(requests.parent.parent)
    control.submit(CaptureRequest(id="gone", next=1))
    assert control.withdraw("gone") and not control.take().incoming
