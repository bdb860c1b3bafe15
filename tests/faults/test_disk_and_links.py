"""Disk and link faults: real file-system trouble under short profiled runs.

The save_path (or a folder of it) made immutable (``chattr +i``), files aprof rewrites
squatted by folders, a real full file system (a small tmpfs in a user namespace, filled and
freed while a driver process runs), and symbolic links planted at every place aprof writes
(the manifest files, the step and window folders, the timeline, a worker's folders, its
``captures.json`` and trace file, the name an earlier run's manifest is kept under), pointing
at files and folders outside save_path, existing or not. Each time: the step bodies run and
nothing escapes, the outside stays as it was, every capture that started is stopped, and the
manifest reads back with every window final.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

import aprof
from faults.common import (
    LedgerTarget,
    check_calls,
    check_outside,
    check_stops,
    check_windows,
    load,
    snapshot,
)
from faults.tally import Faults

pytestmark = pytest.mark.faults

STEPS = (1, 2, 3, 4)
SECRET = b"not aprof's to write\n"
DRIVER_S = 120.0
"""Bound on a driver process."""
RUN_S = 60.0
"""Bound on one profiled run in this process."""

Hook = Callable[[str, int], None]
"""Told ``("before", n)`` before step ``n`` begins (n = 0: before the profiler opens, 5:
before it closes) and ``("inside", n)`` inside step ``n``, once its windows are on disk."""


def config(save: Path, **extra: Any) -> dict[str, Any]:
    return {
        "global_profiler": {"steps": list(STEPS), "save_path": str(save), "wait_for_stops": True},
        "rollout": {"replicas": "all", "start": "on_step", "forward_steps": None},
        "roles": {"actor": {"ranks": [0]}},
        # stop_s also bounds the last manifest write at close: room for a loaded machine.
        "timeouts": {"connect_s": 1, "start_s": 2, "stop_s": 10, "poll_s": 0.01},
        "timeline": {"process": "driver"},
        "log": {"level": "error"},
        **extra,
    }


def targets() -> list[LedgerTarget]:
    """Two replicas and a worker rank."""
    return [
        LedgerTarget("replica_0", replica=0),
        LedgerTarget("replica_1", replica=1),
        LedgerTarget("actor", kind="role", rank=0),
    ]


def never(moment: str, n: int) -> None:
    """No fault."""


async def run(faults: Faults, save: Path, hook: Hook, **extra: Any) -> aprof.Profiler:
    """Steps 1-4 with a request per replica each, ``hook`` injecting faults (see
    :data:`Hook`). Checks that every body ran, nothing escaped and every capture that
    started was stopped."""

    def inject(moment: str, n: int) -> None:
        try:
            hook(moment, n)
        except Exception as exc:  # the test's own trouble, not an escape: ends the test
            pytest.fail(f"injecting the fault ({moment} step {n}) failed: {exc!r}")

    inject("before", 0)
    prof = aprof.Profiler(config(save, **extra))
    team = targets()
    for target in team:
        prof.add_target(target)
    ran: list[int] = []
    try:
        async with asyncio.timeout(RUN_S), prof:
            for n in STEPS:
                inject("before", n)
                await prof.flush()  # a disk that is back is known to be before the step
                try:
                    async with prof.step(n):
                        for replica in (0, 1):
                            async with prof.request(replica=replica):
                                pass
                        await prof.flush()
                        inject("inside", n)
                        ran.append(n)
                except Exception as exc:
                    faults.check("escaped", False, f"step {n}: {type(exc).__name__}: {exc}")
                await prof.flush()  # what the disk says reaches the profiler before the next
            inject("before", len(STEPS) + 1)
            await prof.flush()
    except Exception as exc:
        faults.check("escaped", False, f"profiler: {type(exc).__name__}: {exc}")
    faults.check("escaped", ran == list(STEPS), f"step bodies that ran: {ran}")
    for target in team:
        breaches = check_stops(faults, target)
        assert not breaches, breaches
    return prof


def check_after(faults: Faults, save: Path) -> aprof.Manifest | None:
    manifest = load(faults, save)
    check_windows(faults, manifest)
    return manifest


# -- the save_path refuses writes ---------------------------------------------------------------


@contextmanager
def immutable(folder: Path) -> Iterator[None]:
    """``folder`` takes no new, renamed or removed entry (root included) while inside."""
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True, timeout=30)


@pytest.mark.parametrize("where", [".", "manifest", "timeline", "step_2"])
async def test_immutable_folder(tmp_path: Path, faults: Faults, where: str) -> None:
    """A folder of save_path refuses every change during steps 2-3: the run goes on, the
    windows of those steps say why, step 4 is captured again."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed")
    save = tmp_path / "profile"
    before = snapshot(tmp_path, exclude=[save])
    with ExitStack() as held:

        def hook(moment: str, n: int) -> None:
            if moment != "before":
                return
            if n == 2:
                folder = save / where
                folder.mkdir(parents=True, exist_ok=True)
                held.enter_context(immutable(folder))
                faults.count("disk")
            elif n == 4:
                held.close()

        await run(faults, save, hook)
    manifest = check_after(faults, save)
    assert manifest is not None and {w.state for w in manifest.windows if w.step == 4} == {"done"}
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    faults.assert_nothing_lost()


@pytest.mark.parametrize(
    "squatted", ["manifest.json", "manifest/step_2.json", "timeline/driver.trace.json.gz"]
)
async def test_squatted_file(tmp_path: Path, faults: Faults, squatted: str) -> None:
    """A folder (holding a file) sits where aprof rewrites a file during steps 2-3: the
    rename fails, the run goes on, and once it is gone the manifest is written whole."""
    save = tmp_path / "profile"
    before = snapshot(tmp_path, exclude=[save])
    path = save / squatted

    def hook(moment: str, n: int) -> None:
        # Inside step 2, once its files are written (a first write moves a squatter aside).
        if (moment, n) == ("inside", 2):
            path.unlink()
            (path / "squatter").mkdir(parents=True)
            faults.count("disk")
        elif (moment, n) == ("before", 4):
            shutil.rmtree(path)

    await run(faults, save, hook)
    manifest = check_after(faults, save)
    assert manifest is not None and {w.state for w in manifest.windows if w.step == 4} == {"done"}
    if path.parent.name == "manifest" or path.name == "manifest.json":
        assert path.is_file()  # the timeline's file: see the next test
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    faults.assert_nothing_lost()


async def test_timeline_written_again_once_its_file_is_free(tmp_path: Path, faults: Faults) -> None:
    """The timeline's file squatted by a folder during steps 2-3: once the folder is gone,
    the timeline is written again, and the manifest's entry is the file on disk."""
    save = tmp_path / "profile"
    path = save / "timeline" / "driver.trace.json.gz"

    def hook(moment: str, n: int) -> None:
        if (moment, n) == ("inside", 2):
            path.unlink()
            (path / "squatter").mkdir(parents=True)
            faults.count("disk")
        elif (moment, n) == ("before", 4):
            shutil.rmtree(path)

    prof = await run(faults, save, hook)
    [entry] = prof.manifest.timeline
    assert path.is_file(), "the timeline was not written again"
    assert path.stat().st_size == entry.bytes
    faults.assert_nothing_lost()


# -- a real full file system ----------------------------------------------------------------------

FULL_DISK_DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import aprof
    from faults.common import LedgerTarget, ledger_of

    FILL = {fill!r}  # the moments the file system is filled, by step
    FREE = {free!r}

    def fill(filler: str) -> None:
        with open(filler, "ab", buffering=0) as f:  # to the last byte
            try:
                while True:
                    f.write(b"x" * 4096)
            except OSError:
                pass
        with open(filler, "ab", buffering=0) as f:  # and the last blocks of small writes
            try:
                while True:
                    f.write(b"x")
            except OSError:
                pass

    async def main(save: str) -> None:
        prof = aprof.Profiler({config})
        team = [LedgerTarget(f"replica_{{r}}", replica=r) for r in range(3)]
        team.append(LedgerTarget("actor", kind="role", rank=0))
        for target in team:
            prof.add_target(target)
        filler = os.path.join(os.path.dirname(save), "filler")
        ran, escaped = [], []
        if ("before", 0) in FILL:
            fill(filler)
        async with prof:
            for n in range(1, 9):
                if ("before", n) in FILL:
                    fill(filler)
                if n in FREE and os.path.exists(filler):
                    os.unlink(filler)
                try:
                    async with prof.step(n):
                        for r in range(3):
                            async with prof.request(replica=r):
                                if ("inside", n) in FILL and r == 1:
                                    fill(filler)
                        ran.append(n)
                except Exception as exc:
                    escaped.append(repr(exc))
                await prof.flush()
            if os.path.exists(filler):
                os.unlink(filler)
            await prof.flush()
        calls = {{t.name: [list(c) for c in ledger_of(t)[0]] for t in team}}
        ok = {{t.name: sorted(ledger_of(t)[1]) for t in team}}
        print(json.dumps({{"ran": ran, "escaped": escaped, "calls": calls, "ok": ok}}), flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.parametrize(
    ("fill", "free"),
    [
        pytest.param({("before", 0)}, {3}, id="before-the-open"),
        pytest.param({("before", 2)}, {4}, id="between-steps"),
        pytest.param({("inside", 2), ("inside", 5)}, {3, 7}, id="inside-steps-twice"),
    ],
)
def test_full_disk(
    tmp_path: Path, faults: Faults, fill: set[tuple[str, int]], free: set[int]
) -> None:
    """A real full file system (a 2 MiB tmpfs in a user namespace) while windows run: the
    driver runs every step and exits 0, every started capture is stopped, and once the disk
    has room again the manifest is written whole with every window final."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    mount = tmp_path / "disk"
    mount.mkdir()
    save, copy = mount / "profile", tmp_path / "copy"
    cfg = config(save, rollout={"replicas": "all", "start": "on_first_request"})
    cfg["global_profiler"]["steps"] = list(range(1, 9))
    script = tmp_path / "driver.py"
    script.write_text(FULL_DISK_DRIVER.format(fill=fill, free=free, config=repr(cfg)))
    shell = (
        f"mount -t tmpfs -o size=2m none {mount} && {sys.executable} {script} {save}; "
        f"code=$?; cp -r {save} {copy}; exit $code"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=DRIVER_S,
        env=env,
    )
    if "mount" in done.stderr and done.returncode != 0 and not copy.exists():
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    faults.count("disk", len(fill))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    faults.check("escaped", not report["escaped"], f"escaped: {report['escaped']}")
    faults.check("escaped", report["ran"] == list(range(1, 9)), f"ran: {report['ran']}")
    for name, calls in report["calls"].items():
        breaches = check_calls(faults, name, [tuple(c) for c in calls], set(report["ok"][name]))
        assert not breaches, breaches
    manifest = check_after(faults, copy)
    assert manifest is not None
    lost_room = [n.text for n in manifest.notes if "No space left on device" in n.text]
    assert lost_room, [n.text for n in manifest.notes]
    faults.assert_nothing_lost()


# -- links planted where aprof writes ---------------------------------------------------------

OUTSIDE_FILE = "secret"
LINK_PLACES = {
    # place below save_path: (is it a folder, when it is planted: 0 before the open, or a step)
    "manifest.json": (False, 0),
    "manifest.json@step2": (False, 2),
    "manifest": (True, 0),
    "manifest/step_2.json": (False, 0),
    "step_2": (True, 0),
    "step_2/rollout": (True, 0),
    "step_2/rollout/replica_0": (True, 0),
    "step_2/actor": (True, 0),
    "step_2/actor/rank_0": (True, 0),
    "timeline": (True, 0),
    "timeline/driver.trace.json.gz": (False, 0),
    "timeline/driver.trace.json.gz@step2": (False, 2),
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside save_path holding one file, ``secret``."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / OUTSIDE_FILE).write_bytes(SECRET)
    return folder


def plant(link: Path, outside: Path, *, folder: bool, dangling: bool) -> None:
    """A symbolic link at ``link`` to the outside: its folder, its file, or a name there that
    does not exist yet (which a write through the link would create)."""
    if folder:
        to = outside / "missing_folder" if dangling else outside
    else:
        to = outside / ("missing_file" if dangling else OUTSIDE_FILE)
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.is_file():
        link.unlink()
    link.symlink_to(to, target_is_directory=folder)


@pytest.mark.parametrize("dangling", [False, True], ids=["to-existing", "dangling"])
@pytest.mark.parametrize("place", list(LINK_PLACES))
async def test_link_planted(
    tmp_path: Path, faults: Faults, outside: Path, place: str, dangling: bool
) -> None:
    """A link where the profiler writes, to the outside: the outside stays as it was, the
    run goes on, the manifest reads back with every window final."""
    save = tmp_path / "profile"
    name, _, _ = place.partition("@")
    folder, when = LINK_PLACES[place]
    before = snapshot(tmp_path, exclude=[save])

    def hook(moment: str, n: int) -> None:
        if (moment, n) == ("before", when):
            plant(save / name, outside, folder=folder, dangling=dangling)
            faults.count("links")

    await run(faults, save, hook)
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    check_after(faults, save)
    faults.assert_nothing_lost()


async def test_link_at_the_name_an_earlier_manifest_is_kept_under(
    tmp_path: Path, faults: Faults, outside: Path
) -> None:
    """An earlier run's manifest is kept aside as ``manifest.<time>.json``; a link planted
    at that very name is not written through, and both runs' manifests read back."""
    save = tmp_path / "profile"
    first = await run(faults, save, never)
    old = save / "manifest.json"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(old.stat().st_mtime))
    for name in (f"manifest.{stamp}.json", f"manifest.{stamp}-1.json"):
        (save / name).symlink_to(outside / OUTSIDE_FILE)
        faults.count("links")
    before = snapshot(tmp_path, exclude=[save])
    second = await run(faults, save, never)
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    manifest = check_after(faults, save)
    assert manifest is not None and manifest.run_id == second.manifest.run_id
    [kept] = [p for p in save.glob("manifest.*.json") if not p.is_symlink()]
    earlier = load(faults, kept)
    assert earlier is not None and earlier.run_id == first.manifest.run_id
    faults.assert_nothing_lost()


# -- links where a worker writes ---------------------------------------------------------------

WORKER_PLACES = {
    # place below save_path: is it a folder
    "step_1": True,
    "step_1/actor": True,
    "step_1/actor/rank_0": True,
    "step_1/actor/rank_0/captures.json": False,
    "step_1/actor/rank_0/actor-step1-rank0.pt.trace.json.gz": False,
}


@pytest.mark.parametrize("dangling", [False, True], ids=["to-existing", "dangling"])
@pytest.mark.parametrize("place", list(WORKER_PLACES))
def test_worker_link_planted(
    tmp_path: Path, faults: Faults, outside: Path, place: str, dangling: bool
) -> None:
    """A link where ``aprof.WorkerProfiler`` writes (its folders, its trace, its
    ``captures.json``), to the outside: nothing lands outside, training goes on, step 2 is
    captured, and its ``captures.json`` reads back."""
    pytest.importorskip("torch")
    save = tmp_path / "profile"
    cfg = aprof.load_config(config(save, rollout={"enable": False}))
    plant(save / place, outside, folder=WORKER_PLACES[place], dangling=dangling)
    faults.count("links")
    before = snapshot(tmp_path, exclude=[save])
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    ran = []
    for n in (1, 2):
        try:
            with wp.global_step(n), wp.stage("update_actor"):
                ran.append(n)
        except Exception as exc:
            faults.check("escaped", False, f"step {n}: {type(exc).__name__}: {exc}")
    faults.check("escaped", ran == [1, 2], f"steps that ran: {ran}")
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    states = {c.step: c.state for c in wp.captures}
    assert states[2] == "done", wp.captures
    report = json.loads((save / "step_2" / "actor" / "rank_0" / "captures.json").read_text())
    assert [c["step"] for c in report] == [2]
    faults.assert_nothing_lost()


# -- a slow disk at the end of a run -----------------------------------------------------------

SLOW_DISK_DRIVER = """
import asyncio, sys, time
import aprof
from aprof._layout import OutputLayout
from aprof.testing import RecordingTarget

# A slow disk (a loaded network file system): every file aprof writes takes 0.3 s.
write = OutputLayout.write


def slow(layout, path, data, *, keep_previous=False):
    time.sleep(0.3)
    write(layout, path, data, keep_previous=keep_previous)


OutputLayout.write = slow


async def main(save):
    prof = aprof.Profiler({
        "global_profiler": {"steps": [1, 2], "save_path": save},
        "rollout": {"start": "on_step", "forward_steps": None},
        "timeouts": {"connect_s": 1, "start_s": 5, "stop_s": 0.2, "poll_s": 0.01},
        "log": {"level": "error"},
    })
    prof.add_target(RecordingTarget("replica_0", replica=0))
    async with prof:
        for n in (1, 2):
            async with prof.step(n):
                pass
    print("CLOSED", flush=True)


asyncio.run(main(sys.argv[1]))
"""


def test_the_manifest_of_a_run_on_a_slow_disk_is_written_before_exit(
    tmp_path: Path, faults: Faults
) -> None:
    """A driver whose every file write takes 0.3 s (stop_s 0.2) runs two steps and exits
    normally: its manifest reads back, every window final."""
    script, save = tmp_path / "driver.py", tmp_path / "profile"
    script.write_text(SLOW_DISK_DRIVER)
    faults.count("disk")
    done = subprocess.run(
        [sys.executable, str(script), str(save)], capture_output=True, text=True, timeout=DRIVER_S
    )
    assert done.returncode == 0 and "CLOSED" in done.stdout, done.stderr[-2000:]
    manifest = check_after(faults, save)
    assert manifest is not None and len(manifest.windows) == 2
    faults.assert_nothing_lost()


# -- reading the manifest back -------------------------------------------------------------------

READER = """
import sys
import aprof
try:
    aprof.load_manifest(sys.argv[1])
except aprof.ManifestError as exc:
    print("refused:", exc)
"""
READ_S = 4.0
"""Bound on a reader process."""
READ_BYTES = 1 << 30
"""The reader's address space: a read without bound fails there rather than filling memory."""


def small_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (READ_BYTES, READ_BYTES))


@pytest.mark.parametrize("planted", ["fifo", "link-to-dev-zero"])
def test_reading_the_manifest_back_is_bounded(tmp_path: Path, faults: Faults, planted: str) -> None:
    """A FIFO, or a link to an endless file, planted at manifest.json after a run:
    ``aprof.load_manifest`` refuses it with a ``ManifestError`` at once, as it does any
    other file it cannot read."""
    save = tmp_path / "profile"
    save.mkdir()
    if planted == "fifo":
        os.mkfifo(save / "manifest.json")
        faults.count("disk")
    else:
        (save / "manifest.json").symlink_to("/dev/zero")
        faults.count("links")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(save)],
            capture_output=True,
            text=True,
            timeout=READ_S,
            preexec_fn=small_address_space,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"load_manifest still reading after {READ_S:g}s")
    assert done.stdout.startswith("refused:"), done.stderr[-500:]
    faults.assert_nothing_lost()


WORKER_SWAPS = ["step_1", "step_1/actor", "step_1/actor/rank_0"]


@pytest.mark.parametrize("place", WORKER_SWAPS)
def test_worker_folder_swapped_while_capturing(
    tmp_path: Path, faults: Faults, outside: Path, place: str
) -> None:
    """While a worker's capture runs, a folder on the way to it is moved out of save_path
    and a link left in its place: nothing of the capture lands outside."""
    pytest.importorskip("torch")
    save = tmp_path / "profile"
    cfg = aprof.load_config(config(save, rollout={"enable": False}))
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    before: dict[str, Any] = {}
    try:
        with wp.global_step(1), wp.stage("update_actor"):
            shutil.move(save / place, outside / "moved")
            (save / place).symlink_to(outside / "moved", target_is_directory=True)
            faults.count("links")
            before.update(snapshot(tmp_path, exclude=[save]))
    except Exception as exc:
        faults.check("escaped", False, f"{type(exc).__name__}: {exc}")
    check_outside(faults, before, snapshot(tmp_path, exclude=[save]))
    faults.assert_nothing_lost()
