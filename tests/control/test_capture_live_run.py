"""``aprof capture`` from other processes against a live run: a test driver (a subprocess:
two reference servers, the demo's trainer process as a worker group, 30 steps of which the
config selects none) pauses after step 10 until the test has placed its requests; then the
requests are decided at the run's step boundaries.

What it checks: ``--next 2 --wait`` gets exactly the two steps its answer names captured on
every target, each window done and ``requested_by: on_demand``; ``--steps 3`` (a step long
past) is refused with the reason; two ``--steps 20`` racing make one window per target; a
garbage, an oversized, a linked, a FIFO and a half-written request file are each answered
with why and removed, and the run finishes all its steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._control import ControlFolder

DRIVER = Path(__file__).with_name("capture_driver.py")
LIMIT_S = 240.0
STEPS = 30
PAUSE = 10
TARGETS = ["replica_0", "replica_1", "trainer"]


async def _cli(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "aprof",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _until(condition: object, what: str, driver: asyncio.subprocess.Process) -> None:
    """Poll ``condition()`` (bounded by the test's limit) while the driver still runs."""
    assert callable(condition)
    while not condition():
        if driver.returncode is not None:
            pytest.fail(f"the driver ended before {what}")
        await asyncio.sleep(0.05)


def _hostile_requests(requests: Path, outside: Path) -> dict[str, str]:
    """Hostile request files, by the id each is answered under, with what its answer says."""
    requests.mkdir(parents=True, exist_ok=True)
    (requests / "garbage.json").write_bytes(b"\x00\xffnot json at all")
    (requests / "oversized.json").write_bytes(b"{" + b" " * (70 * 1024) + b"}")
    outside.write_text(json.dumps({"id": "linked", "next": 1}))
    (requests / "linked.json").symlink_to(outside)
    os.mkfifo(requests / "fifo.json")
    (requests / "half.json").write_text('{"id": "half", "ne')
    (requests / "wrong-field.json").write_text(json.dumps({"id": "wrong-field", "nxt": 1}))
    return {
        "garbage": "not a JSON document",
        "oversized": "larger than",
        "linked": "link",
        "fifo": "not a regular file",
        "half": "not a JSON document",
        "wrong-field": "nxt",
    }


async def test_capture_adds_steps_to_a_live_run_from_other_processes(tmp_path: Path) -> None:
    save_path = tmp_path / "run"
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DRIVER),
        str(save_path),
        "--steps",
        str(STEPS),
        "--pause",
        str(PAUSE),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    clis: list[asyncio.subprocess.Process] = []
    try:
        async with asyncio.timeout(LIMIT_S):
            await _until((tmp_path / "paused").exists, "pausing", driver)
            requests = save_path / "control" / "requests"
            outside = tmp_path / "outside.json"
            expected = _hostile_requests(requests, outside)
            wait_next = await _cli("capture", str(save_path), "--next", "2", "--wait")
            past = await _cli("capture", str(save_path), "--steps", "3")
            racing = [await _cli("capture", str(save_path), "--steps", "20") for _ in range(2)]
            clis = [wait_next, past, *racing]
            # Each command has written its request (atomically) once it is in the folder.
            await _until(
                lambda: sum(1 for p in requests.iterdir() if not p.name.startswith(".")) >= 4 + 6,
                "the requests were written",
                driver,
            )
            (tmp_path / "go").write_text("go")
            outputs = [await cli.communicate() for cli in clis]
            driver_out, _ = await driver.communicate()
    finally:
        for proc in [driver, *clis]:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert driver.returncode == 0, driver_out.decode(errors="replace")[-3000:]
    (next_out, next_err), (past_out, _) = outputs[0], outputs[1]
    assert wait_next.returncode == 0, (next_out, next_err)
    assert past.returncode == 1 and b"refused: step(s) 3 began already" in past_out, past_out
    assert all(r.returncode == 0 for r in racing), outputs[2:]

    answers = save_path / "control" / "answers"
    decided = [json.loads(p.read_text()) for p in answers.iterdir()]
    mine = [a for a in decided if a["accepted"] and a["steps"] != [20]]
    [next_answer] = mine
    first = next_answer["decided_at"]
    assert next_answer["steps"] == [first, first + 1] and first > PAUSE
    assert next_answer["targets"] == TARGETS
    lines = next_out.decode().splitlines()
    assert lines[0].startswith(f"accepted: steps {first}-{first + 1} on replica_0, replica_1")
    ended = sorted(line.split(",")[0] for line in lines[1:])
    assert ended == sorted(f"step {n} {t}: done" for n in (first, first + 1) for t in TARGETS)
    racing_answers = [a for a in decided if a["steps"] == [20]]
    assert len(racing_answers) == 2 and all(a["accepted"] for a in racing_answers)
    assert sorted(bool(a["merged"]) for a in racing_answers) == [False, True]

    manifest = aprof.load_manifest(save_path)
    windows = {(w.step, w.target): w for w in manifest.windows}
    assert set(windows) == {(n, t) for n in (first, first + 1, 20) for t in TARGETS}
    assert all(w.state == "done" and w.requested_by == "on_demand" for w in windows.values())
    for n in (first, first + 1):
        for r in (0, 1):
            assert windows[(n, f"replica_{r}")].forward_steps.requested == 2

    by_id = {a["id"]: a for a in decided}
    for request_id, why in expected.items():
        answer = by_id[request_id]
        assert not answer["accepted"] and why in answer["reason"], answer
    assert not [p for p in requests.iterdir() if not p.name.startswith(".")]
    assert outside.read_text() == json.dumps({"id": "linked", "next": 1})  # not followed
    status = ControlFolder(save_path).status()
    assert status is not None and status.state == "ended" and status.last_step == STEPS


async def test_a_step_file_renamed_into_place_while_it_is_looked_for_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a once-failed ``aprof capture --wait``: a step file missing when read
    and there when looked for just after (the run renamed it into place between) is read
    again, not called unreadable."""
    from aprof import _manifest
    from aprof._manifest import load
    from aprof.testing import RecordingTarget

    cfg = {
        "global_profiler": {"steps": [1], "save_path": str(tmp_path)},
        "log": {"level": "warning"},
    }
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        async with prof.step(1):
            pass
    real = load.read_regular
    missed: list[str] = []

    def not_yet(path: Any, limit: int, **kwargs: Any) -> bytes:
        if str(path).endswith("step_1.json") and not missed:
            missed.append(str(path))
            raise FileNotFoundError(2, "No such file or directory")
        return real(path, limit, **kwargs)

    monkeypatch.setattr(load, "read_regular", not_yet)
    windows = _manifest.load_step(tmp_path, 1, prof.manifest.run_id)
    assert missed and [(w.step, w.target) for w in windows] == [(1, "replica_0")]
