"""Every Python process aprof starts imports the installed aprof and its libraries, whatever the
working folder holds: ``aprof demo`` run from a folder holding packages named as aprof's own
(a clone, say) and as the libraries its children import, and each child on its own there.

Running ``python -m aprof`` from such a folder is the user's own choice (Python puts the folder
first then); the console script, and every child aprof starts, leave it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import aprof
from aprof._merge import parallel
from aprof._merge.placing import Input
from aprof._merge.scratch import Scratch
from servers import launch, launch_spec
from servers.process import free_port

SHADOWS = ("aprof", "servers", "agentloop", "json", "msgspec", "orjson")
"""Packages the working folder holds: aprof's, and libraries its children import."""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A working folder holding a package for each of :data:`SHADOWS` that, once imported,
    leaves ``imported-<name>`` in ``tmp_path`` and fails."""
    folder = tmp_path / "clone"
    for name in SHADOWS:
        package = folder / name
        package.mkdir(parents=True)
        marker = tmp_path / f"imported-{name}"
        (package / "__init__.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
            f"raise ImportError('the working folder\\'s {name} was imported')\n"
        )
    return folder


def imported(tmp_path: Path) -> list[str]:
    """The packages of the working folder some process imported."""
    return sorted(p.name.removeprefix("imported-") for p in tmp_path.glob("imported-*"))


def test_demo_runs_from_a_folder_holding_an_aprof_package(tmp_path: Path, clone: Path) -> None:
    """``aprof demo`` (the console script) from such a folder: its reference server, its
    trainer process and its merge import the installed packages, and the demo ends well."""
    pytest.importorskip("torch")  # the demo's servers and trainer run torch
    script = Path(sysconfig.get_path("scripts")) / "aprof"
    out = tmp_path / "out"
    command = [str(script), "demo", "--num-steps", "1", "--steps", "1", "--replicas", "1"]
    command += ["--concurrency", "1", "--forward-steps", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=clone, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert imported(tmp_path) == []
    assert f"merged: {out / 'merged' / 'step_1.trace.json.gz'} (step 1" in done.stdout
    states = [(w.target, w.state) for w in aprof.load_manifest(out).windows]
    assert sorted(states) == [("replica_0", "done"), ("trainer", "done")]


async def test_the_reference_server_launched_from_such_a_folder_is_healthy(
    tmp_path: Path, clone: Path
) -> None:
    """A reference server ``servers.launch`` starts there imports the installed aprof."""
    spec = launch_spec("reference", None, version="0.32.0", port=free_port(), profiling=False)
    log = tmp_path / "server.log"
    async with await launch(spec, log_path=log, cwd=clone, health_timeout_s=120) as server:
        assert server.process.returncode is None
    assert imported(tmp_path) == [], log.read_text()


def test_a_merge_worker_started_there_places_its_share(
    tmp_path: Path, clone: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge worker started from such a folder is ready and places the capture it took."""
    root = tmp_path / "run"
    root.mkdir()
    event = {"name": "x", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}
    trace = {"traceEvents": [event], "baseTimeNanoseconds": 1_000_000_000}
    (root / "t.trace.json").write_text(json.dumps(trace))
    item = Input("t.trace.json", "t", 2)
    shares = parallel.Shares([item])
    out = tmp_path / "out"
    out.mkdir()
    folder = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    scratch = Scratch(folder)
    monkeypatch.chdir(clone)
    workers = parallel.Workers(1, scratch)
    try:
        for serving in workers.serve(shares, root, 1, 0):
            serving.result(timeout=120)
        taken = shares.take(item)
        assert taken is not None, "no worker was ready to take it"
        assert taken.result().placed.events > 0
    finally:
        workers.close()
        scratch.close()
        os.close(folder)
    assert imported(tmp_path) == []


WRITER = """
import sys
from aprof._timeline.writer_process import WriterProcess

sys.exit(0 if WriterProcess.shared() is not None else 3)
"""


def test_the_timeline_writer_process_starts_there(tmp_path: Path, clone: Path) -> None:
    """The timeline writer process started from such a folder is ready."""
    script = tmp_path / "start_writer.py"
    script.write_text(WRITER)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=clone, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert imported(tmp_path) == []
