"""A disk that refuses the manifest never reaches training: the run goes on, captures pause,
and the manifest says what was lost once it can be written again.

The faults are real: a save_path made immutable (``chattr +i``, which stops root too), a
file that cannot be replaced (a folder where the manifest goes), and a full file system (a
small tmpfs mounted in a user namespace, filled while the driver runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import aprof
from aprof._safe_files import _HOST, TEMP_SUFFIX
from aprof.testing import RecordingTarget, assert_windows

MakeConfig = Callable[..., aprof.ProfilerConfig]
STATES = ("done", "failed", "failed", "done")


@contextmanager
def immutable(folder: Path) -> Iterator[None]:
    """``folder`` refuses new, renamed and removed entries (root included) while inside."""
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


async def test_a_read_only_save_path_pauses_captures_and_the_run_goes_on(
    make_config: MakeConfig,
) -> None:
    """Steps 2-3 run while save_path takes no new entry: their bodies run, nothing raises,
    their windows are failed with the reason, and once the folder takes writes again step 4
    is captured and the manifest says when it could not be written."""
    cfg = make_config(global_profiler={"steps": [1, 2, 3, 4]}, rollout={"start": "on_step"})
    target = RecordingTarget("replica_0", replica=0)
    bodies = []
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1):
            bodies.append(1)
        await prof.flush()
        with immutable(prof.save_path):
            for n in (2, 3):
                async with prof.step(n):
                    bodies.append(n)
                await prof.flush()  # the writer has told the profiler by now
        async with prof.step(4):
            bodies.append(4)
    assert bodies == [1, 2, 3, 4]
    manifest = aprof.load_manifest(prof.save_path)
    assert_windows(
        manifest,
        [{"step": n, "state": state} for n, state in enumerate(STATES, start=1)],
    )
    errors = [w.error or "" for w in manifest.windows]
    assert errors[1].startswith("cannot create") and "Operation not permitted" in errors[1]
    assert errors[2].startswith("not started: the manifest cannot be written")
    [lost] = [n.text for n in manifest.notes if n.step is None]
    assert "the manifest could not be written from" in lost and "1 window(s)" in lost
    assert len(target.starts) == 2  # steps 1 and 4


async def test_a_manifest_that_cannot_be_replaced_stops_the_running_capture(
    make_config: MakeConfig,
) -> None:
    """A folder squatting on the step's manifest file: the next change cannot be written, so
    the active window is stopped early (its stop sent, its files listed) and noted, and no
    capture starts; the manifest is written once the way is clear."""
    cfg = make_config(
        global_profiler={"steps": [1, 2]}, rollout={"replicas": "all", "forward_steps": None}
    )
    first, second = RecordingTarget("replica_0", replica=0), RecordingTarget("replica_1", replica=1)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(first)
        prof.add_target(second)
        file = prof.save_path / "manifest" / "step_1.json"
        async with prof.step(1):
            async with prof.request(replica=0) as req:
                assert req.captured
            await prof.flush()
            file.unlink()
            (file / "x").mkdir(parents=True)  # a rename over a folder holding something fails
            async with prof.request(replica=1):  # opens replica 1's window: a change
                pass
            await prof.flush()  # the write failed, and the profiler was told
            await first.wait_calls("stop", 1)  # stopped by the profiler, inside the step
        async with prof.step(2), prof.request(replica=0) as req:
            assert not req.captured  # no capture starts while the disk refuses
        shutil.rmtree(file)
        await prof.flush()
    manifest = aprof.load_manifest(prof.save_path)
    stopped = manifest.window(1, "replica_0")
    assert stopped is not None and stopped.state == "done" and stopped.stop_reason == "error"
    assert stopped.files, "the stopped capture's files are listed"
    early = [n for n in manifest.notes if "stopped early" in n.text]
    assert [n.target for n in early] == ["replica_0", "replica_1"]
    assert manifest.window(2, "replica_0").error.startswith("not started")  # type: ignore[union-attr]
    assert any(n.step is None and "could not be written" in n.text for n in manifest.notes)
    assert len(first.starts) == 1


FULL_DISK_DRIVER = textwrap.dedent(
    """
    import asyncio, os, sys
    import aprof
    from aprof.testing import RecordingTarget

    async def main(save: str) -> None:
        prof = aprof.Profiler({
            "global_profiler": {"steps": [1, 2, 3, 4], "save_path": save},
            "rollout": {"start": "on_step"},
            "log": {"level": "error"},
        })
        prof.add_target(RecordingTarget("replica_0", replica=0))
        filler = os.path.join(save, "..", "filler")
        ran = []
        async with prof:
            async with prof.step(1):
                ran.append(1)
            await prof.flush()
            with open(filler, "wb", buffering=0) as f:  # fill the file system to the last byte
                try:
                    while True:
                        f.write(b"x" * 4096)
                except OSError:
                    pass
            for n in (2, 3):
                async with prof.step(n):
                    ran.append(n)
                await prof.flush()
            os.unlink(filler)
            async with prof.step(4):
                ran.append(4)
        print("RAN", ran, flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


def test_a_full_disk_is_survived_and_reported(tmp_path: Path) -> None:
    """A real full file system (tmpfs of 1 MiB in a user namespace) fills after step 1: the
    driver runs every step and exits 0; steps 2-3 are not captured and say why; step 4 is."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    mount = tmp_path / "disk"
    mount.mkdir()
    script = tmp_path / "driver.py"
    script.write_text(FULL_DISK_DRIVER)
    save = mount / "profile"
    copy = tmp_path / "copy"
    shell = (
        f"mount -t tmpfs -o size=1m none {mount} && {sys.executable} {script} {save}; code=$?; "
        f"cp -r {save} {copy}; exit $code"
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell], capture_output=True, text=True, timeout=120
    )
    if "mount" in done.stderr and done.returncode != 0 and not copy.exists():
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "RAN [1, 2, 3, 4]" in done.stdout
    manifest = aprof.load_manifest(copy)
    states = {w.step: (w.state, w.error or "") for w in manifest.windows}
    assert states[1] == ("done", "") and states[4] == ("done", "")
    for n in (2, 3):
        assert states[n][0] == "failed", states
    assert any("No space left on device" in n.text for n in manifest.notes if n.step is None)


def ended_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return int(done.stdout)


async def test_temp_files_of_killed_runs_are_removed_at_the_next_open(
    make_config: MakeConfig,
) -> None:
    """Temporary files a killed process of this host left (its pid is gone) are removed when
    the same save_path is opened again; those of a live process and other files stay."""
    cfg = make_config()
    save = Path(cfg.global_profiler.save_path)
    pid = ended_pid()
    stale = [
        save / f".manifest.json.{_HOST}.{pid}.0123456789abcdef{TEMP_SUFFIX}",
        save / "manifest" / f".step_3.json.{_HOST}.{pid}.00000000000000ff{TEMP_SUFFIX}",
        save / "timeline" / f".d.trace.json.gz.{_HOST}.{pid}.abcdefabcdefabcd{TEMP_SUFFIX}",
    ]
    kept = [
        save / f".manifest.json.{_HOST}.{os.getpid()}.0123456789abcdef{TEMP_SUFFIX}",
        save / f".manifest.json.otherhost.{pid}.0123456789abcdef{TEMP_SUFFIX}",
        save / "notes.txt",
    ]
    for path in stale + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    async with aprof.Profiler(cfg) as prof:
        await prof.flush()  # the writer removes them before its first write
    assert [p.exists() for p in stale] == [False] * len(stale)
    assert [p.exists() for p in kept] == [True] * len(kept)
