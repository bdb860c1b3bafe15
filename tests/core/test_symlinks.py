"""Nothing is written outside save_path, whatever links are planted inside it.

Each test plants real symbolic links (to a file or a folder outside save_path) where aprof
writes: its temporary names, the manifest files, a step folder, the timeline folder, a worker's
rank folder and a trace file's name. The file outside must keep its content and the folder
outside must stay empty; the run goes on and says what it refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

import aprof
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]
SECRET = b"not aprof's to write\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside save_path holding one file, ``secret``."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_bytes(SECRET)
    return folder


def untouched(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == SECRET


async def run_steps(prof: aprof.Profiler, steps: range) -> None:
    async with prof:
        for n in steps:
            async with prof.step(n), prof.request(replica=0):
                pass


def plant(link: Path, to: Path) -> None:
    """A symbolic link at ``link`` (its folder made) pointing at ``to``."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(to, target_is_directory=to.is_dir())


async def test_links_at_manifest_and_temporary_names_are_replaced_not_followed(
    make_config: MakeConfig, outside: Path
) -> None:
    """Links at the manifest files and at every temporary name aprof used to write through
    (``.manifest.json.<pid>.tmp``): the outside file keeps its content, the manifest files are
    plain files again."""
    cfg = make_config(global_profiler={"steps": [1]})
    save = Path(cfg.global_profiler.save_path)
    (save / "manifest").mkdir(parents=True)
    secret = outside / "secret"
    planted = [save / "manifest.json", save / "manifest" / "step_1.json"]
    planted += [
        save / f".manifest.json.{pid}.tmp" for pid in range(os.getpid() - 5, os.getpid() + 50)
    ]
    for link in planted:
        link.symlink_to(secret)
    prof = aprof.Profiler(cfg)
    prof.add_target(RecordingTarget("replica_0", replica=0))
    await run_steps(prof, range(1, 2))
    untouched(outside)
    for name in ("manifest.json", "manifest/step_1.json"):
        assert not (save / name).is_symlink()
    assert aprof.load_manifest(save).window(1, "replica_0").state == "done"  # type: ignore[union-attr]


async def test_a_linked_step_folder_fails_its_windows_only(
    make_config: MakeConfig, outside: Path
) -> None:
    """``step_1`` links to a folder outside: step 1's window fails naming the link, nothing is
    written there, step 2 is captured."""
    cfg = make_config(global_profiler={"steps": [1, 2]})
    save = Path(cfg.global_profiler.save_path)
    plant(save / "step_1", outside)
    target = RecordingTarget("replica_0", replica=0)
    prof = aprof.Profiler(cfg)
    prof.add_target(target)
    await run_steps(prof, range(1, 3))
    untouched(outside)
    manifest = aprof.load_manifest(save)
    step_1 = prof.manifest.window(1, "replica_0")
    assert step_1 is not None and step_1.state == "failed"
    assert "is a symbolic link" in (step_1.error or "")
    assert manifest.window(2, "replica_0").state == "done"  # type: ignore[union-attr]
    assert [w.step for w in target.starts] == [2]


async def test_a_linked_timeline_folder_is_refused(make_config: MakeConfig, outside: Path) -> None:
    """``timeline`` links outside: the timeline is not written (the run goes on), nothing
    lands outside."""
    cfg = make_config(global_profiler={"steps": [1]})
    save = Path(cfg.global_profiler.save_path)
    plant(save / "timeline", outside)
    prof = aprof.Profiler(cfg)
    prof.add_target(RecordingTarget("replica_0", replica=0))
    await run_steps(prof, range(1, 3))
    untouched(outside)
    assert prof.manifest.timeline == []
    assert prof.manifest.window(1, "replica_0").state == "done"  # type: ignore[union-attr]


def test_a_worker_writes_nothing_through_a_linked_rank_folder(
    make_config: MakeConfig, outside: Path
) -> None:
    """A worker's role folder links outside: the capture fails naming the link, and neither
    the trace nor ``captures.json`` lands outside."""
    pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [1]}, roles={"actor": {"ranks": [0]}})
    save = Path(cfg.global_profiler.save_path)
    (save / "step_1").mkdir(parents=True)
    (save / "step_1" / "actor").symlink_to(outside, target_is_directory=True)
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    with wp.global_step(1):
        pass
    untouched(outside)
    [capture] = wp.captures
    assert capture.state == "failed" and "is a symbolic link" in (capture.error or "")


def test_a_link_at_the_trace_file_name_is_not_written_through(
    make_config: MakeConfig, outside: Path
) -> None:
    """A link planted at the name torch would export the trace to: the capture fails, the
    file outside keeps its content."""
    pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [1]}, roles={"actor": {"ranks": [0]}})
    save = Path(cfg.global_profiler.save_path)
    rank = save / "step_1" / "actor" / "rank_0"
    rank.mkdir(parents=True)
    (rank / "actor-step1-rank0.pt.trace.json.gz").symlink_to(outside / "secret")
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=1)
    with wp.global_step(1):
        pass
    untouched(outside)
    [capture] = wp.captures
    assert capture.state == "failed" and "does not write over" in (capture.error or "")
    assert (rank / "captures.json").is_file()
