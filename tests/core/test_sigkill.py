"""What a run killed with SIGKILL leaves behind: a manifest that parses and tells the truth.

A driver script runs in a real subprocess, opens a rollout window, says ``ACTIVE`` on stdout
once the manifest on disk shows the window running, then blocks; the test kills it with
SIGKILL and reads the manifest back. Every wait is bounded. The last test checks, in process,
that every manifest write (any of which a kill may leave behind) is complete for a skipped
window.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aprof
from aprof._layout import OutputLayout
from aprof.testing import RecordingTarget

LINE_TIMEOUT_S = 60.0
"""Bound on the driver's first line (interpreter start and imports included)."""

DRIVER = """
import asyncio
import sys

import aprof
from aprof.testing import RecordingTarget


async def main(save: str, mode: str) -> None:
    forward_steps = None if mode == "until_step_end" else 1000
    prof = aprof.Profiler({
        "global_profiler": {"steps": [1], "save_path": save},
        "rollout": {"replicas": [0], "forward_steps": forward_steps},
        "timeouts": {"connect_s": 5, "start_s": 30, "stop_s": 30, "poll_s": 0.01},
        "log": {"level": "error"},
    })
    target = RecordingTarget("replica_0", replica=0, enforces_window=mode == "server")
    prof.add_target(target)
    async with prof, prof.step(1):
        async with prof.request(replica=0) as req:
            target.advance(1)
        if mode == "aprof":  # the poller has read its baseline counter
            await target.wait_calls("forward_steps", 1)
        record = prof.manifest.window(1, "replica_0")
        await prof.flush()
        on_disk = aprof.load_manifest(save).window(1, "replica_0")
        if not req.captured or on_disk is None or on_disk.started_ns is None:
            print("NOT-ACTIVE", req, on_disk, flush=True)
            sys.exit(1)
        print("ACTIVE", record.forward_steps.enforced_by, flush=True)
        await asyncio.Event().wait()  # blocks until killed


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line ``proc`` writes to stdout, or ``""`` at EOF; fails after ``timeout_s``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"no line from the driver within {timeout_s:g}s (got {data!r})")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode().partition("\n")[0]


def kill_when_active(tmp_path: Path, mode: str) -> tuple[Path, str]:
    """Run the driver in ``mode`` until it says ACTIVE, SIGKILL it; returns save path and line."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    save = tmp_path / "profile"
    stderr = tmp_path / "driver.stderr"
    with stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(save), mode], stdout=subprocess.PIPE, stderr=err
        )
        try:
            line = read_line(proc, LINE_TIMEOUT_S)
            assert line.startswith("ACTIVE"), f"driver said {line!r}; stderr:\n{stderr.read_text()}"
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            assert proc.stdout is not None
            proc.stdout.close()
    return save, line


def test_sigkill_leaves_a_parsable_manifest_with_the_window_running(tmp_path: Path) -> None:
    """Killed while its window is active, the driver leaves a manifest that parses, shows
    the window ``running`` with its start time and no stop, and no half-written temp file."""
    save, _ = kill_when_active(tmp_path, "until_step_end")
    manifest = aprof.load_manifest(save)
    [window] = manifest.windows
    assert (window.step, window.target, window.kind) == (1, "replica_0", "rollout")
    assert window.state == "running"
    assert window.started_ns is not None and window.stopped_ns is None
    assert window.stop_reason is None and window.error is None
    written = sorted(p.relative_to(save).as_posix() for p in save.rglob("*") if p.is_file())
    assert [p for p in written if "manifest" in p] == ["manifest.json", "manifest/step_1.json"]
    assert not [p for p in written if p.endswith(".aprof-tmp")], written


@pytest.mark.parametrize("mode", ["server", "aprof"])
def test_sigkill_manifest_says_who_enforces_the_running_window(tmp_path: Path, mode: str) -> None:
    """A window bounded to ``forward_steps`` is enforced by the server (``enforces_window``)
    or by aprof's poller; a run killed while it is active should say so on disk, as the
    live manifest does."""
    save, line = kill_when_active(tmp_path, mode)
    assert line == f"ACTIVE {mode}"  # the live manifest knew
    window = aprof.load_manifest(save).window(1, "replica_0")
    assert window is not None and window.state == "running"
    assert window.forward_steps.enforced_by == mode


async def test_skipped_window_is_written_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window that ends before the previous stop of its target finished is ``skipped``;
    every manifest written from then on (what a killed run would leave) says why."""
    written: list[tuple[str, str | None]] = []
    write = OutputLayout.write

    def spy(layout: OutputLayout, path: Path, data: bytes, *, keep_previous: bool = False) -> None:
        write(layout, path, data, keep_previous=keep_previous)
        if path.name == "step_2.json":
            record = aprof.load_manifest(layout.root).window(2, "replica_0")
            if record is not None:
                written.append((record.state, record.error))

    monkeypatch.setattr(OutputLayout, "write", spy)
    gate = asyncio.Event()
    target = RecordingTarget("replica_0", replica=0, stop_gate=gate)
    prof = aprof.Profiler(
        {
            "global_profiler": {"steps": [1, 2], "save_path": str(tmp_path / "profile")},
            "rollout": {"start": "on_step", "forward_steps": None},
            "timeouts": {"connect_s": 5, "start_s": 5, "stop_s": 5, "poll_s": 0.01},
        }
    )
    prof.add_target(target)
    async with prof:
        async with prof.step(1):
            pass
        async with prof.step(2):  # queued behind the stop of step 1, held by the gate
            pass
        gate.set()
    record = prof.manifest.window(2, "replica_0")
    assert record is not None and record.state == "skipped"
    skipped = [error for state, error in written if state == "skipped"]
    assert skipped and None not in skipped, written
