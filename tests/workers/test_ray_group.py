"""aprof.ray on a real local Ray cluster: actors with torch captures, one killed mid-window."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import aprof
import aprof.ray
from aprof._report import accounting

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")
torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_workers.py"
MakeConfig = Callable[..., aprof.ProfilerConfig]


class TrainWorker(aprof.ray.ProfilerMixin):
    """One rank of the actor role: a stage that runs a few torch ops."""

    def __init__(self, cfg: aprof.ProfilerConfig, rank: int) -> None:
        torch.set_num_threads(1)
        self.init_profiler(cfg, role="actor", rank=rank, world_size=2)

    @aprof.staged("update_actor")
    def update_actor(self) -> float:
        return float(torch.ones(8, 8).matmul(torch.ones(8, 8)).sum())


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the module (starting one takes seconds)."""
    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local test cluster needs no token
    # Actors unpickle this test module's classes: it is not importable in Ray's workers.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if previous is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous


def test_the_example_profiles_every_rank_stage_by_stage(tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--steps", "1"]
    command += ["--num-steps", "2", "--workers", "2", "--ranks", "0,1", "--mode", "discrete"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-4000:]

    manifest = aprof.load_manifest(tmp_path)
    (window,) = manifest.windows
    assert (window.step, window.target, window.state) == (1, "actor", "done")
    stages = ["compute_log_prob", "update_actor"]
    assert [(c.rank, c.stage, c.state) for c in window.captures] == [
        (rank, stage, "done") for rank in (0, 1) for stage in stages
    ]
    for capture in window.captures:
        (file,) = capture.files
        assert file.path == (
            f"step_1/actor/rank_{capture.rank}/{capture.stage}-step1-rank{capture.rank}"
            ".pt.trace.json.gz"
        )
        with gzip.open(tmp_path / file.path, "rt") as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert capture.stage in names
    assert not (tmp_path / "step_2").exists()
    assert "step 1 rank 1 done" in done.stdout

    # Each rank's stages are on its own timeline in every step, listed by the driver: the
    # driver runs no stage of its own, so the training time is theirs, step 2's included.
    processes = {f.process.rsplit("-", 1)[0] for f in manifest.timeline}
    assert {"actor-rank0", "actor-rank1"} <= processes
    accounts = {a.step: a for a in accounting(tmp_path).accounts}
    assert sorted(accounts) == [1, 2]
    assert all(a.train_s > 0 for a in accounts.values())


async def test_actor_killed_mid_window_fails_its_capture_only(
    ray_cluster: None, make_config: MakeConfig
) -> None:
    cfg = make_config(
        global_profiler={"steps": [1], "wait_for_stops": True},
        roles={"actor": {"all_ranks": True}},
        timeouts={"start_s": 60, "stop_s": 60},  # actors import torch before their first call
    )
    worker = ray.remote(TrainWorker)
    actors = [worker.remote(cfg, rank) for rank in range(2)]
    try:
        group = aprof.ray.worker_group("actor", actors, cfg)
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(group)
            async with prof.step(1):
                assert await actors[0].update_actor.remote() == 512.0
                assert await actors[1].update_actor.remote() == 512.0
                ray.kill(actors[1])
                # ray.kill returns at once, and a call made just after it may still be served:
                # call until one fails, so the actor is known dead before the step ends (or
                # its end could still reach it).
                async with asyncio.timeout(60):
                    while True:
                        try:
                            await actors[1].__ray_ready__.remote()
                        except ray.exceptions.RayActorError:
                            break
    finally:
        for actor in actors:
            ray.kill(actor)

    manifest = aprof.load_manifest(cfg.global_profiler.save_path)
    (window,) = manifest.windows
    assert (window.state, window.error) == ("done", None)
    live, killed = window.captures
    assert (live.rank, live.state, live.error) == (0, "done", None)
    (file,) = live.files
    assert file.path == "step_1/actor/rank_0/actor-step1-rank0.pt.trace.json.gz"
    assert [f.path for f in window.files] == [file.path]
    with gzip.open(cfg.global_profiler.save_path / file.path, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name") == "update_actor" and e.get("ph") == "X" for e in events)
    assert (killed.rank, killed.state, killed.files) == (1, "failed", [])
    assert killed.error is not None and killed.error.startswith("end failed: ActorDiedError:")
    assert any(n.text.startswith("failed captures: rank 1: end failed") for n in manifest.notes)


def test_worker_group_checks_its_actors(ray_cluster: None, make_config: MakeConfig) -> None:
    cfg = make_config(roles={"actor": {}})

    @ray.remote
    class Plain:
        def ping(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"actors\[0\] is not a Ray actor handle"):
        aprof.ray.worker_group("actor", [object()], cfg)
    plain = Plain.remote()
    try:
        with pytest.raises(TypeError, match=r"mix aprof\.ray\.ProfilerMixin into its class"):
            aprof.ray.worker_group("actor", [plain], cfg)
    finally:
        ray.kill(plain)
