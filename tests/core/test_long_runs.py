"""A long run costs the same per window at its end as at its start.

Recording a window change writes that step's file only (one window per target), the run's
own file does not grow with the steps, and the live manifest lets go of finished steps once
they are on disk. Speed itself is measured by ``benchmarks/bench_long_run.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import aprof
from aprof._layout import OutputLayout
from aprof._manifest import files as _manifest_files
from aprof.testing import RecordingTarget

MakeConfig = Callable[..., aprof.ProfilerConfig]
TARGETS = 8
STEPS = 60


async def test_a_window_change_writes_one_step_and_the_run_file_does_not_grow(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step profiled over 8 targets: each write holds one step's windows at most, and
    the run file written at step 60 is no larger than at step 2."""
    written: list[tuple[str, bytes]] = []
    write = OutputLayout.write

    def spy(layout: OutputLayout, path: Path, data: bytes, *, keep_previous: bool = False) -> None:
        written.append((path.relative_to(layout.root).as_posix(), data))
        write(layout, path, data, keep_previous=keep_previous)

    monkeypatch.setattr(OutputLayout, "write", spy)
    cfg = make_config(
        global_profiler={"steps": {"every": 1}},
        rollout={"replicas": "all", "start": "on_step", "forward_steps": None},
    )
    prof = aprof.Profiler(cfg)
    run_sizes = {}
    async with prof:
        for r in range(TARGETS):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
        for n in range(1, STEPS + 1):
            async with prof.step(n):
                pass
            await prof.flush()
            run_sizes[n] = len(next(d for p, d in reversed(written) if p == "manifest.json"))
    step_writes = [json.loads(d) for p, d in written if p.startswith("manifest/")]
    assert {len(s["windows"]) for s in step_writes} <= set(range(TARGETS + 1))
    assert all({w["step"] for w in s["windows"]} == {s["step"]} for s in step_writes)
    # The timeline's size in the run file may gain digits; nothing else grows.
    assert run_sizes[STEPS] - run_sizes[2] < 16, run_sizes
    assert len(aprof.load_manifest(prof.save_path).windows) == STEPS * TARGETS


async def test_the_live_manifest_lets_go_of_finished_steps_on_disk(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for 40 windows, a run of 60 steps x 8 targets holds at most that many (plus
    the step in flight) in memory; every window and note is still read back from disk, in
    step order."""
    monkeypatch.setattr(_manifest_files, "RETAINED_WINDOWS", 40)
    cfg = make_config(
        global_profiler={"steps": {"every": 1}},
        rollout={"replicas": "all", "start": "on_step", "forward_steps": None},
    )
    prof = aprof.Profiler(cfg)
    held = []
    async with prof:
        for r in range(TARGETS):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r))
        for n in range(1, STEPS + 1):
            async with prof.step(n):
                pass
            await prof.flush()
            held.append(len(prof.manifest.windows))
        async with prof.step(1):  # a step again, long released: a note of the run
            pass
    assert max(held) <= 40 + TARGETS, held
    manifest = aprof.load_manifest(prof.save_path)
    assert [(w.step, w.target) for w in manifest.windows] == [
        (n, f"replica_{r}") for n in range(1, STEPS + 1) for r in range(TARGETS)
    ]
    assert all(w.state == "done" for w in manifest.windows)
    [again] = manifest.notes
    assert again.step == 1 and "entered again" in again.text


async def test_the_step_in_progress_is_never_let_go(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even with room for a single window, the step in progress stays in memory: windows
    that failed at once are final, yet the step still gets its skipped windows at its end,
    and its file on disk holds them all."""
    monkeypatch.setattr(_manifest_files, "RETAINED_WINDOWS", 1)
    cfg = make_config(
        global_profiler={"steps": [1, 2, 3]}, rollout={"replicas": "all", "forward_steps": None}
    )
    prof = aprof.Profiler(cfg)
    async with prof:
        for r in range(4):
            prof.add_target(RecordingTarget(f"replica_{r}", replica=r, fail_start=True))
        for n in (1, 2, 3):
            async with prof.step(n):
                for r in (0, 1):  # replicas 2 and 3 get no request: skipped at step end
                    async with prof.request(replica=r):
                        pass
                await prof.flush()  # the failed starts are written: a release may run
    manifest = aprof.load_manifest(prof.save_path)
    assert [(w.step, w.target, w.state) for w in manifest.windows] == [
        (n, f"replica_{r}", "failed" if r < 2 else "skipped") for n in (1, 2, 3) for r in range(4)
    ]
