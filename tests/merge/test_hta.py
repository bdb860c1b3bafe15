"""A step's rank traces as Holistic Trace Analysis reads them: the engine-workers example as a
real 2-process gloo job (both ranks captured), exported with ``aprof export hta`` and
``aprof.hta_trace_files``, then loaded by the real ``traceinsight`` package (``import hta``)
where it is installed (CI installs it; ``pip install --no-deps traceinsight==0.6.1 pandas
psutil``)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import aprof
from aprof._merge import export_hta

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "engine_workers.py"


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose ranks captured stage by stage (``discrete``): the actor's two stages per
    rank, the ref's one (one real 2-process job serves every test here: each costs about
    half a minute on a 2-core machine)."""
    out = tmp_path_factory.mktemp("discrete")
    command = [sys.executable, str(EXAMPLE), "--out", str(out), "--steps", "1"]
    command += ["--num-steps", "1", "--world-size", "2", "--ranks", "0,1", "--mode", "discrete"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(params=["ref", "actor"])
def role(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """A role with one trace per rank (``ref``), and one with two that a stage picks."""
    return ("ref", None) if request.param == "ref" else ("actor", "update_actor")


def test_each_rank_has_its_trace_and_the_folder_holds_nothing_else(
    staged: Path, role: tuple[str, str | None]
) -> None:
    out, (name, stage) = staged, role
    if stage is not None:  # two stages of the actor per rank: HTA takes one trace per rank
        with pytest.raises(aprof.ExportError, match=r"2 traces .*name a stage"):
            aprof.hta_trace_files(out, 1, name)
    files = aprof.hta_trace_files(out, 1, name, stage=stage)
    assert sorted(files) == [0, 1]
    assert all(f.is_file() and f"rank_{k}" in f.parts for k, f in files.items())

    folder, made = export_hta(out, 1, name, stage=stage)
    assert folder == out / "hta" / "step_1" / name
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank_0.pt.trace.json.gz",
        "rank_1.pt.trace.json.gz",
    ]
    for rank, path in made.items():  # a link to the rank's own trace, which names its rank
        assert os.path.samestat(path.stat(), files[rank].stat())
    # Again: the earlier export is replaced; a folder holding anything else is refused.
    export_hta(out, 1, name, stage=stage)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(aprof.ExportError, match="not empty"):
        export_hta(out, 1, name, stage=stage)
    for step, other, why in (
        (2, name, "no captures"),
        (1, "critic", "no captures"),
        (1, "..", "no role"),
    ):
        with pytest.raises(aprof.ExportError, match=why):
            aprof.hta_trace_files(out, step, other)


def test_a_trace_that_names_no_rank_is_copied_with_its_rank(staged: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(staged, out)
    files = aprof.hta_trace_files(out, 1, "ref")
    with gzip.open(files[1], "rt") as f:
        trace = json.load(f)
    del trace["distributedInfo"]  # as torch writes it without torch.distributed
    with gzip.open(files[1], "wt") as f:
        json.dump(trace, f)
    _, made = export_hta(out, 1, "ref", out=tmp_path / "hta")
    assert not os.path.samestat(made[1].stat(), files[1].stat())  # a copy
    with gzip.open(made[1], "rt") as f:
        copied = json.load(f)
    assert copied["distributedInfo"] == {"rank": 1}
    assert copied["traceEvents"] == trace["traceEvents"]


def test_holistic_trace_analysis_reads_the_export_by_folder_and_by_map(
    staged: Path, role: tuple[str, str | None]
) -> None:
    """Both ranks parsed, by ``trace_dir`` and by ``trace_files``. HTA's temporal breakdown
    measures GPU kernels: on these CPU traces HTA itself fails (IndexError in
    ``_get_idle_time_for_kernels``), so it is not called here (docs/workers.md)."""
    pytest.importorskip("hta", reason="pip install --no-deps traceinsight==0.6.1 pandas psutil")
    from hta.trace_analysis import TraceAnalysis

    out, (name, stage) = staged, role
    folder, _ = export_hta(out, 1, name, out=out / f"for-hta-{name}", stage=stage)
    by_folder = TraceAnalysis(trace_dir=str(folder))
    files = aprof.hta_trace_files(out, 1, name, stage=stage)
    by_map = TraceAnalysis(trace_files={k: str(v) for k, v in files.items()})
    for analysis in (by_folder, by_map):
        assert sorted(analysis.t.traces) == [0, 1]
        for rank in (0, 1):
            ops = analysis.t.get_trace(rank)
            assert len(ops) > 0  # the rank's CPU ops, as HTA's data frame holds them


def test_the_command_line(staged: Path, tmp_path: Path) -> None:
    out = staged
    command = [sys.executable, "-m", "aprof", "export", "hta", str(out), "--step", "1"]
    done = subprocess.run(
        [*command, "--role", "ref", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{tmp_path / 'x'}: 2 ranks (0, 1) for HTA's trace_dir\n"
    bad = subprocess.run(
        [*command, "--role", "nobody"], capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == "aprof export: step 1 has no captures of role 'nobody'\n"
