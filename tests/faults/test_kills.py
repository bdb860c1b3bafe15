"""SIGKILL: drivers killed at random moments leave manifests that load and tell the truth.

A driver process runs a profiled loop (``RecordingTarget`` replicas and a worker rank,
every step profiled, thousands of steps) and prints a line after each step; the test kills
it with SIGKILL after a random number of lines, 20 times, five kills in a row on each of four
save paths (a restarted job reuses its save_path). After each kill: the driver's process
group (its timeline writer) is gone, the manifest loads, every window is final or
``running``, and a new ``aprof.Profiler`` opened on the same save_path removes the temporary
files of the killed processes (``*.aprof-tmp``) and writes a fresh manifest, keeping the
killed run's aside (``manifest.<time>.json``), where it still loads. Seeded: a failure
reproduces.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import aprof
from aprof._safe_files import _HOST, TEMP_SUFFIX
from faults.common import check_windows, load
from faults.tally import Faults

pytestmark = pytest.mark.faults

KILLS = 20
IN_A_ROW = 5
"""Kills per save_path, one after another."""
SEED = 20261201
LINE_S = 60.0
"""Bound on the driver's next line (its first one includes interpreter start and imports)."""
GONE_S = 30.0
"""Bound on the driver's process group ending after the kill."""

DRIVER = """
import asyncio
import random
import sys

import aprof
from aprof.testing import RecordingTarget


async def main(save: str, seed: int) -> None:
    rng = random.Random(seed)
    prof = aprof.Profiler({
        "global_profiler": {"steps": {"every": 1}, "save_path": save},
        "rollout": {
            "replicas": "all",
            "start": rng.choice(["on_step", "on_first_request"]),
            "forward_steps": rng.choice([2, None]),
        },
        "roles": {"actor": {"ranks": [0]}},
        "timeouts": {"connect_s": 1, "start_s": 2, "stop_s": 2, "poll_s": 0.005},
        "log": {"level": "error"},
    })
    replicas = [
        RecordingTarget(
            f"replica_{r}",
            replica=r,
            enforces_window=rng.random() < 0.5,
            start_latency=rng.choice([0.0, 0.001]),
            stop_latency=rng.choice([0.0, 0.002]),
            fail_stop={n for n in range(1, 10_000) if rng.random() < 0.05},
        )
        for r in range(3)
    ]
    for target in replicas:
        prof.add_target(target)
    prof.add_target(RecordingTarget("actor", kind="role", rank=0))

    async def request(r: int) -> None:
        async with prof.request(replica=r):
            replicas[r].advance(1)
            await asyncio.sleep(0)

    async with prof:
        for n in range(1, 10_000):
            async with prof.step(n):
                await asyncio.gather(*(request(i % 3) for i in range(24)))
            if rng.random() < 0.3:
                await prof.flush()
            print("STEP", n, flush=True)


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def read_lines(proc: subprocess.Popen[bytes], count: int) -> int:
    """Read ``count`` lines of ``proc``'s stdout (each within ``LINE_S``); returns how many
    came before it ended."""
    assert proc.stdout is not None
    fd, data, seen = proc.stdout.fileno(), b"", 0
    while seen < count:
        ready, _, _ = select.select([fd], [], [], LINE_S)
        if not ready:
            pytest.fail(f"no line from the driver within {LINE_S:g}s (after {seen} lines)")
        chunk = os.read(fd, 65536)
        if not chunk:
            return seen
        data += chunk
        seen = data.count(b"\n")
    return seen


def group_alive(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that have not ended (zombies count as ended)."""
    alive = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                stat = file.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(entry.name))
    return alive


def wait_gone(pgid: int) -> list[int]:
    """Wait (at most ``GONE_S``) until group ``pgid`` has ended; returns what is left."""
    deadline = time.monotonic() + GONE_S
    left = group_alive(pgid)
    while left and time.monotonic() < deadline:
        # No event tells a process outside our children has ended: a bounded poll.
        time.sleep(0.02)
        left = group_alive(pgid)
    return left


def temp_files(save: Path) -> list[Path]:
    return sorted(p for p in save.rglob(f"*{TEMP_SUFFIX}"))


def reopen(save: Path) -> str:
    """Open and close a new profiler on ``save`` (as a restarted job would); its run id."""

    async def run() -> str:
        again = aprof.Profiler({"global_profiler": {"save_path": str(save)}})
        async with asyncio.timeout(GONE_S), again:
            await again.flush()
        return again.manifest.run_id

    return asyncio.run(run())


def test_sigkill_at_random_moments(tmp_path: Path, faults: Faults) -> None:
    """20 drivers killed at random moments: manifests load with every window final or
    running, and the next open cleans up and keeps the killed run's manifest aside."""
    rng = random.Random(SEED)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    for kill in range(KILLS):
        save = tmp_path / f"profile_{kill // IN_A_ROW}"
        lines = rng.randint(1, 40)
        stderr = tmp_path / f"driver_{kill}.stderr"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, str(script), str(save), str(rng.randrange(2**32))],
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # its own group: the timeline writer is in it too
            )
            try:
                seen = read_lines(proc, lines)
                assert seen >= lines, f"the driver ended after {seen} lines: {stderr.read_text()}"
                os.kill(proc.pid, signal.SIGKILL)
                assert proc.wait(timeout=GONE_S) == -signal.SIGKILL
                faults.count("kills")
                left = wait_gone(proc.pid)
                assert not left, f"processes of the killed driver still run: {left}"
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=GONE_S)
                for pid in group_alive(proc.pid):
                    os.kill(pid, signal.SIGKILL)
                assert proc.stdout is not None
                proc.stdout.close()

        # What the kill left: a manifest that loads, windows final or running.
        killed = load(faults, save)
        check_windows(faults, killed, running_ok=True)
        assert killed is not None
        # A write cut off midway leaves a temporary file: one the kill could have left is
        # planted too (the killed driver's name for it), so the clean-up is always tried.
        where = rng.choice([save, save / "manifest", save / "timeline"])
        where.mkdir(exist_ok=True)
        token = f"{rng.getrandbits(64):016x}"
        (where / f".manifest.json.{_HOST}.{proc.pid}.{token}{TEMP_SUFFIX}").write_bytes(b"{")

        # The next run on the same save_path.
        run_id = reopen(save)
        assert temp_files(save) == [], temp_files(save)
        fresh = load(faults, save)
        assert fresh is not None and fresh.run_id == run_id
        kept = {}
        for path in save.glob("manifest.*.json"):
            earlier = load(faults, path)
            if earlier is not None:
                kept[earlier.run_id] = earlier
        assert killed.run_id in kept, f"{killed.run_id} not kept aside: {sorted(kept)}"
        assert kept[killed.run_id].windows == killed.windows
    faults.assert_nothing_lost()
