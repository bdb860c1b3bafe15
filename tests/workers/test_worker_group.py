"""WorkerGroup as a role target: per-rank fan-out, failure isolation, captures in the manifest."""

from __future__ import annotations

import asyncio
import gzip
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aprof
from aprof._workers import CAPTURES_FILE

MakeConfig = Callable[..., aprof.ProfilerConfig]
Behaviour = Literal["ok", "raise_begin", "hang_begin", "raise_end", "hang_end"]
BEHAVIOURS: tuple[Behaviour, ...] = ("ok", "raise_begin", "hang_begin", "raise_end", "hang_end")
FAST = {"start_s": 1.0, "stop_s": 1.0}
"""Bounds small enough that a hanging rank costs little (each rank gets 90% of them), with a
margin of 0.1 s for the group's own work on a loaded machine."""


class ScriptedWorker:
    """An in-process WorkerHandle standing in for a remote rank that raises or hangs.

    A remote rank cannot fail on cue here; this one raises in ``begin`` or ``end``, or waits
    on an event nobody sets. When it works, ``end`` writes one file into its rank folder.
    """

    def __init__(self, rank: int, save_path: Path, behaviour: Behaviour = "ok") -> None:
        self.rank = rank
        self.calls: list[str] = []
        self._save_path = save_path
        self._behaviour = behaviour
        self._step = 0
        self._began = False

    async def begin(self, step: int) -> None:
        self.calls.append(f"begin {step}")
        self._step = step
        await self._misbehave("begin")
        self._began = True

    async def end(self) -> list[aprof.WorkerCapture]:
        self.calls.append("end")
        started = time.time_ns()
        if not self._began:  # nothing opened: a begin that raised or was cut off
            return []
        self._began = False
        await self._misbehave("end")
        path = f"step_{self._step}/actor/rank_{self.rank}/scripted.json"
        (self._save_path / path).parent.mkdir(parents=True, exist_ok=True)
        (self._save_path / path).write_text("{}")
        capture = aprof.WorkerCapture(
            step=self._step,
            last_step=self._step,
            role="actor",
            rank=self.rank,
            stage=None,
            tool="torch",
            state="done",
            files=(aprof.CaptureFile(path=path, bytes=2),),
            error=None,
            note=None,
            started_ns=started,
            stopped_ns=time.time_ns(),
        )
        return [capture]

    async def timeline(self) -> aprof.WorkerTimeline | None:
        return None  # a rank with no timeline of its own: the group lists none

    async def _misbehave(self, call: str) -> None:
        if self._behaviour == f"hang_{call}":
            await asyncio.Event().wait()
        if self._behaviour == f"raise_{call}":
            raise RuntimeError(f"rank {self.rank} cannot {call}")


def scripted(save_path: Path, behaviours: Sequence[Behaviour]) -> list[ScriptedWorker]:
    return [ScriptedWorker(rank, save_path, b) for rank, b in enumerate(behaviours)]


async def run_steps(
    cfg: aprof.ProfilerConfig, target: aprof.CaptureTarget, steps: int, body: Any = None
) -> aprof.Manifest:
    """Run ``steps`` global steps with ``target``; the manifest as read back from disk."""
    async with asyncio.timeout(30), aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        for n in range(1, steps + 1):
            async with prof.step(n):
                if body is not None:
                    body(n)
    manifest = aprof.load_manifest(cfg.global_profiler.save_path)
    assert manifest.model_dump() == prof.manifest.model_dump()
    return manifest


def group_config(make_config: MakeConfig, **role: Any) -> aprof.ProfilerConfig:
    return make_config(
        global_profiler={"steps": [1], "wait_for_stops": True},
        roles={"actor": role or {"all_ranks": True}},
        timeouts=FAST,
    )


# -- in-process handles that fail ---------------------------------------------------------------


async def test_a_raising_or_hanging_rank_fails_only_its_capture(make_config: MakeConfig) -> None:
    cfg = group_config(make_config)
    save_path = cfg.global_profiler.save_path
    workers = scripted(save_path, ["ok", "raise_begin", "hang_end", "hang_begin", "ok"])
    manifest = await run_steps(cfg, aprof.WorkerGroup("actor", workers, cfg), steps=1)

    (window,) = manifest.windows
    assert (window.state, window.kind, window.error) == ("done", "role", None)
    assert [f.path for f in window.files] == [
        "step_1/actor/rank_0/scripted.json",
        "step_1/actor/rank_4/scripted.json",
    ]
    bound = 0.9 * FAST["start_s"]
    assert [(c.rank, c.state, c.error) for c in window.captures] == [
        (0, "done", None),
        (1, "failed", "begin failed: RuntimeError: rank 1 cannot begin"),
        (2, "failed", f"end timed out after {bound:g}s"),
        (3, "failed", f"begin timed out after {bound:g}s"),
        (4, "done", None),
    ]
    assert [f.path for f in window.captures[0].files] == ["step_1/actor/rank_0/scripted.json"]
    for capture in window.captures:
        assert capture.step == capture.last_step == 1
        assert capture.stage is None
        assert capture.started_ns <= capture.stopped_ns
    # Ranks that began are ended, and so is one whose begin ran out of time (it may begin late).
    began, refused = ["begin 1", "end"], ["begin 1"]
    assert [w.calls for w in workers] == [began, refused, began, began, began]
    (on_disk,) = json.loads((save_path / "manifest" / "step_1.json").read_text())["windows"]
    assert [c["rank"] for c in on_disk["captures"]] == [0, 1, 2, 3, 4]
    (note,) = [n.text for n in manifest.notes if n.target == "actor"]
    assert note.startswith("failed captures: rank 1: begin failed")
    assert "rank 2: end timed out" in note and "rank 3: begin timed out" in note


async def test_every_rank_failing_to_begin_fails_the_window(make_config: MakeConfig) -> None:
    cfg = group_config(make_config)
    workers = scripted(cfg.global_profiler.save_path, ["raise_begin", "hang_begin"])
    manifest = await run_steps(cfg, aprof.WorkerGroup("actor", workers, cfg), steps=1)

    (window,) = manifest.windows
    assert (window.state, window.stop_reason) == ("failed", "error")
    assert window.error == (
        "start failed: WorkerGroupError: no rank began: "
        "rank 0: begin failed: RuntimeError: rank 0 cannot begin; "
        f"rank 1: begin timed out after {0.9 * FAST['start_s']:g}s"
    )
    assert [w.calls for w in workers] == [["begin 1"], ["begin 1"]]


async def test_every_rank_failing_to_end_fails_the_window(make_config: MakeConfig) -> None:
    cfg = group_config(make_config)
    workers = scripted(cfg.global_profiler.save_path, ["hang_end", "raise_begin", "raise_end"])
    manifest = await run_steps(cfg, aprof.WorkerGroup("actor", workers, cfg), steps=1)

    (window,) = manifest.windows
    assert window.state == "failed"
    assert window.error is not None and window.error.startswith(
        "stop failed: WorkerGroupError: every rank failed: rank 0: end timed out"
    )
    assert "rank 1: begin failed" in window.error and "rank 2: end failed" in window.error


async def test_only_selected_ranks_are_driven(make_config: MakeConfig) -> None:
    cfg = group_config(make_config, ranks=[0, 2])
    save_path = cfg.global_profiler.save_path
    workers = scripted(save_path, ["ok"] * 4)
    group = aprof.WorkerGroup("actor", workers, cfg)
    assert [w.rank for w in group.selected] == [0, 2]
    manifest = await run_steps(cfg, group, steps=2)

    (window,) = manifest.windows
    assert [(c.rank, c.state) for c in window.captures] == [(0, "done"), (2, "done")]
    assert [w.calls for w in workers] == [["begin 1", "end"], [], ["begin 1", "end"], []]
    ranks = sorted(p.name for p in (save_path / "step_1" / "actor").iterdir())
    assert ranks == ["rank_0", "rank_2"]
    assert not manifest.notes


async def test_a_group_with_no_selected_rank_fails_its_windows(make_config: MakeConfig) -> None:
    cfg = group_config(make_config, ranks=[5])
    workers = scripted(cfg.global_profiler.save_path, ["ok", "ok"])
    manifest = await run_steps(cfg, aprof.WorkerGroup("actor", workers, cfg), steps=1)

    (window,) = manifest.windows
    assert window.error == (
        "start failed: WorkerGroupError: roles.actor selects none of the group's ranks (0, 1)"
    )
    assert [w.calls for w in workers] == [[], []]


def test_group_rejects_bad_members(make_config: MakeConfig, tmp_path: Path) -> None:
    cfg = group_config(make_config)
    with pytest.raises(ValueError, match="has no workers"):
        aprof.WorkerGroup("actor", [], cfg)
    twins = [ScriptedWorker(1, tmp_path), ScriptedWorker(1, tmp_path)]
    with pytest.raises(ValueError, match=r"holds a rank twice: \[1, 1\]"):
        aprof.WorkerGroup("actor", twins, cfg)
    with pytest.raises(ValueError, match="not path-safe"):
        aprof.WorkerGroup("../actor", [ScriptedWorker(0, tmp_path)], cfg)


def test_group_is_a_managed_role_target_with_a_role_folder(make_config: MakeConfig) -> None:
    cfg = group_config(make_config)
    group = aprof.WorkerGroup("actor", scripted(Path("."), ["ok"]), cfg, name="actor_group")
    assert isinstance(group, aprof.CaptureTarget) and isinstance(group, aprof.ManagedTarget)
    assert (group.name, group.role, group.kind, group.replica) == (
        "actor_group",
        "actor",
        "role",
        None,
    )
    assert not group.enforces_window and not hasattr(group, "rank")


@settings(max_examples=40, deadline=None)
@given(
    behaviours=st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=5),
    selected=st.sets(st.integers(0, 4), min_size=1),
)
def test_outcome_follows_the_ranks_behaviours(
    behaviours: list[Behaviour], selected: set[int]
) -> None:
    """Whatever each rank does, the group's outcome is decided by the selected ranks alone."""
    with tempfile.TemporaryDirectory() as folder:
        save_path = Path(folder)
        cfg = aprof.load_config(
            {
                "global_profiler": {"steps": [1], "save_path": folder},
                "roles": {"actor": {"ranks": sorted(selected)}},
                "timeouts": {"start_s": 0.02, "stop_s": 0.02},
            }
        )
        workers = scripted(save_path, behaviours)
        group = aprof.WorkerGroup("actor", workers, cfg)
        window = aprof.Window(1, "actor", "role", 0, None, save_path / "step_1" / "actor", "w")
        outcome = asyncio.run(drive(group, window))

    chosen = [w for w in workers if w.rank in selected]
    some_began = any(w._behaviour not in ("raise_begin", "hang_begin") for w in chosen)
    for worker in workers:
        if worker not in chosen:
            assert worker.calls == []
        elif worker._behaviour == "raise_begin" or not some_began:
            assert worker.calls == ["begin 1"]
        else:
            assert worker.calls == ["begin 1", "end"]
    if not chosen:
        assert isinstance(outcome, str) and outcome.startswith(
            "start failed: roles.actor selects none of the group's ranks"
        )
        return
    if all(w._behaviour in ("raise_begin", "hang_begin") for w in chosen):
        assert isinstance(outcome, str) and outcome.startswith("start failed: no rank began")
        return
    if all(w._behaviour != "ok" for w in chosen):
        assert isinstance(outcome, str) and outcome.startswith("stop failed: every rank failed")
        return
    assert isinstance(outcome, aprof.CaptureResult)
    assert [(c.rank, c.state == "done") for c in outcome.captures] == [
        (w.rank, w._behaviour == "ok") for w in chosen
    ]
    assert len(outcome.files) == sum(w._behaviour == "ok" for w in chosen)
    assert (outcome.note is None) == all(w._behaviour == "ok" for w in chosen)


async def drive(group: aprof.WorkerGroup, window: aprof.Window) -> aprof.CaptureResult | str:
    """One window through the group as the scheduler drives it; a failure as text."""
    try:
        await group.start(window)
    except RuntimeError as exc:
        return f"start failed: {exc}"
    try:
        return await group.stop(window)
    except RuntimeError as exc:
        return f"stop failed: {exc}"


# -- LocalWorker: a WorkerProfiler in the driver's process, real torch captures ----------------


def user_ranges(path: Path, name: str) -> int:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sum(1 for e in events if e.get("name") == name and e.get("ph") == "X")


async def test_local_worker_e2e_real_torch_capture(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [1, 3]}, roles={"actor": {}})
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0, world_size=2)
    group = aprof.WorkerGroup("actor", [aprof.LocalWorker(wp)], cfg)

    def train(n: int) -> None:
        with wp.stage("update_actor"):
            torch.ones(8).sum()

    manifest = await run_steps(cfg, group, steps=3, body=train)

    assert [(w.step, w.state) for w in manifest.windows] == [(1, "done"), (3, "done")]
    save_path = cfg.global_profiler.save_path
    for window in manifest.windows:
        n = window.step
        (capture,) = window.captures
        assert (capture.rank, capture.state, capture.step, capture.last_step) == (0, "done", n, n)
        (file,) = capture.files
        assert file.path == f"step_{n}/actor/rank_0/actor-step{n}-rank0.pt.trace.json.gz"
        assert [f.path for f in window.files] == [file.path]
        assert file.bytes == (save_path / file.path).stat().st_size > 0
        assert user_ranges(save_path / file.path, "update_actor") == 1
        report = json.loads((save_path / f"step_{n}/actor/rank_0" / CAPTURES_FILE).read_text())
        assert [r["step"] for r in report] == [n]
    assert not (save_path / "step_2").exists()


async def test_local_worker_continuous_window_is_one_capture(make_config: MakeConfig) -> None:
    torch = pytest.importorskip("torch")
    cfg = make_config(
        global_profiler={"steps": [1, 2], "continuous": True},
        roles={"actor": {}},
    )
    wp = aprof.WorkerProfiler(cfg, role="actor", rank=0)
    group = aprof.WorkerGroup("actor", [aprof.LocalWorker(wp)], cfg)

    def train(n: int) -> None:
        with wp.stage("update_actor"):
            torch.ones(8).sum()

    manifest = await run_steps(cfg, group, steps=3, body=train)

    (window,) = manifest.windows
    assert (window.step, window.state, window.stop_reason) == (1, "done", "step_end")
    (capture,) = window.captures
    assert (capture.step, capture.last_step, capture.state) == (1, 2, "done")
    (file,) = capture.files
    assert file.path == "step_1/actor/rank_0/actor-step1-rank0.pt.trace.json.gz"
    # Steps 1 and 2 inside, step 3 outside: the end of step 2 waited for the stop.
    assert user_ranges(cfg.global_profiler.save_path / file.path, "update_actor") == 2
    assert len(wp.captures) == 1
