"""verl 0.9.1's own worker groups profiled by aprof: ``@DistProfiler.annotate`` stages of
``@register`` workers on a real local Ray cluster, driven by aprof's ``BlockingProfiler``.

The workers are small ones built as verl's ``ActorRolloutRefWorker`` is (``Worker`` with
``DistProfilerExtension``, an inner ``actor`` whose own ``DistProfiler`` steps per
mini-batch); verl's GPU stack is not needed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof._report import accounting

pytest.importorskip("verl", reason="verl is not installed (nox -s verl installs 0.9.1)")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")
torch = pytest.importorskip("torch")

from ray.util.placement_group import remove_placement_group  # noqa: E402
from verl.single_controller.base.decorator import Dispatch, register  # noqa: E402
from verl.single_controller.base.worker import Worker  # noqa: E402
from verl.single_controller.ray.base import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
)
from verl.utils.profiler import DistProfiler, DistProfilerExtension  # noqa: E402
from verl.utils.profiler.config import ProfilerConfig, TorchProfilerToolConfig  # noqa: E402

CALL_S = 120.0
"""Bound on each remote call the test waits for (a worker's first call imports torch)."""
WORKERS = 2


class TinyActor:
    """verl's inner ``TrainingWorker`` in small: its own ``DistProfiler``, and a profiler step
    after each update mini-batch."""

    def __init__(self, rank: int) -> None:
        self.profiler = DistProfiler(rank=rank)  # verl's default: disabled

    @DistProfiler.annotate(color="red", role="train_batch")
    def train_batch(self, x: Any) -> float:
        return float(x.matmul(x).sum())

    def train_mini_batch(self, mini_batches: int) -> float:
        total = 0.0
        for index in range(mini_batches):
            with torch.profiler.record_function(f"mini_batch{index}"):
                total += self.train_batch(torch.ones(16, 16))
            self.profiler.step()
        return total


class TinyWorker(Worker, DistProfilerExtension):
    """One rank in the shape of verl's ``ActorRolloutRefWorker``, with verl's own torch
    profiler switched on (aprof replaces it)."""

    def __init__(self, verl_save_path: str) -> None:
        Worker.__init__(self)
        torch.set_num_threads(1)
        own = ProfilerConfig(
            tool="torch",
            enable=True,
            all_ranks=True,
            save_path=verl_save_path,
            tool_config=TorchProfilerToolConfig(),
        )
        DistProfilerExtension.__init__(
            self,
            DistProfiler(rank=self.rank, config=own, tool_config=TorchProfilerToolConfig()),
        )
        self.actor: TinyActor | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        self.actor = TinyActor(self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    @DistProfiler.annotate(color="blue", role="actor_compute_log_prob")
    def compute_log_prob(self) -> float:
        x = torch.ones(32, 32)
        return float(x.matmul(x).sum())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    @DistProfiler.annotate(color="red", role="actor_update", scheduled=True)
    def update_actor(self, mini_batches: int) -> float:
        assert self.actor is not None
        return self.actor.train_mini_batch(mini_batches)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def profiler_kind(self) -> list[str]:
        """The class names of this worker's and its inner actor's profilers."""
        inner = getattr(self.actor, "profiler", None)
        return [type(self.profiler).__name__, type(inner).__name__]


class PlainWorker(Worker):
    """A verl worker without ``DistProfilerExtension``."""


MakeGroup = Callable[[Any], RayWorkerGroup]


@pytest.fixture
def make_group(ray_cluster: None) -> Iterator[MakeGroup]:
    """verl groups of 2 CPU workers on the module's Ray cluster (``conftest.py``); their
    workers are killed and their placement groups freed after the test."""
    made: list[RayWorkerGroup] = []

    def build(cls_with_init: Any) -> RayWorkerGroup:
        # One CPU per bundle (verl's default asks 10 per worker); no GPU.
        pool = RayResourcePool([WORKERS], use_gpu=False, max_colocate_count=1)
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls_with_init)
        made.append(group)
        return group

    yield build
    for group in made:
        for worker in group.workers:
            ray.kill(worker)
        for pg in group.resource_pool.pgs or []:
            remove_placement_group(pg)


def _config(tmp_path: Path, steps: list[int], **actor: Any) -> dict[str, Any]:
    return {
        "global_profiler": {
            "steps": steps,
            "save_path": str(tmp_path / "profile"),
            "tool": "torch",
        },
        "roles": {"actor": actor},
        "timeouts": {"start_s": CALL_S, "stop_s": CALL_S},
    }


def _profiled(cfg: dict[str, Any], tmp_path: Path, role: str = "actor") -> RayClassWithInitArgs:
    cls = aprof.verl.profiled_worker(TinyWorker, cfg, role=role)
    return RayClassWithInitArgs(cls=ray.remote(cls), verl_save_path=str(tmp_path / "verl"))


def _get(refs: Any) -> Any:
    return ray.get(refs, timeout=CALL_S)


def _ranges(path: Path) -> set[str]:
    """The names of the complete events (ranges) of a torch trace."""
    with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as f:
        events = json.load(f)["traceEvents"]
    return {e["name"] for e in events if e.get("ph") == "X"}


def test_profiled_worker_checks_the_class() -> None:
    with pytest.raises(TypeError, match=r"PlainWorker is not a verl worker.*DistProfilerExtension"):
        aprof.verl.profiled_worker(PlainWorker, {}, role="actor")
    with pytest.raises(TypeError, match=r"pass the class, not ray\.remote"):
        aprof.verl.profiled_worker(ray.remote(TinyWorker), {}, role="actor")
    cls = aprof.verl.profiled_worker(TinyWorker, {"roles": {"actor": {}}}, role="actor")
    assert cls.__name__ == "AprofTinyWorker"
    assert issubclass(cls, TinyWorker)
    with pytest.raises(TypeError, match="RayWorkerGroup"):
        aprof.verl.worker_group(object(), "actor", {})


def test_e2e_steps_capture_verl_stages_on_every_rank(make_group: MakeGroup, tmp_path: Path) -> None:
    cfg = _config(tmp_path, [1, 3], all_ranks=True)
    wg = make_group(_profiled(cfg, tmp_path))
    _get(wg.init_model())
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(aprof.verl.worker_group(wg, "actor", cfg))
        for n in (1, 2, 3):
            with prof.step(n):
                # verl's trainer, its own profiler left on: these start nothing. (verl's
                # blocking calls, through verl's own fan-out, so that the wait is bounded.)
                _get(wg.execute_all_async("start_profile", role="train", profile_step=n))
                assert _get(wg.compute_log_prob()) == [32.0**3] * WORKERS
                assert _get(wg.update_actor(3)) == [3 * 16.0**3] * WORKERS
                _get(wg.execute_all_async("stop_profile"))
    # The inner actor's profiler was pointed at the worker's on the first window.
    assert _get(wg.profiler_kind()) == [["AprofDistProfiler"] * 2] * WORKERS

    save_path = tmp_path / "profile"
    manifest = aprof.load_manifest(save_path)
    assert [(w.step, w.target, w.state) for w in manifest.windows] == [
        (1, "actor", "done"),
        (3, "actor", "done"),
    ]
    for window in manifest.windows:
        n = window.step
        assert [(c.rank, c.stage, c.state) for c in window.captures] == [
            (0, None, "done"),
            (1, None, "done"),
        ]
        for capture in window.captures:
            (file,) = capture.files
            k = capture.rank
            assert file.path == f"step_{n}/actor/rank_{k}/actor-step{n}-rank{k}.pt.trace.json.gz"
            names = _ranges(save_path / file.path)
            assert {"actor_compute_log_prob", "actor_update", "train_batch"} <= names
            assert {"mini_batch0", "mini_batch2"} <= names
    assert not (save_path / "step_2").exists()
    assert not (tmp_path / "verl").exists()  # verl's own torch profiler never wrote

    # verl's annotated stages are on each rank's own timeline in every step, step 2 too: the
    # driver runs no stage of its own, so the training time the report finds is theirs.
    processes = {f.process.rsplit("-", 1)[0] for f in manifest.timeline}
    assert {"actor-rank0", "actor-rank1"} <= processes
    accounts = {a.step: a for a in accounting(save_path).accounts}
    assert sorted(accounts) == [1, 2, 3]
    assert all(a.train_s > 0 for a in accounts.values())


def test_discrete_captures_each_stage_on_the_selected_rank_only(
    make_group: MakeGroup, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, [2], ranks=[1], discrete=True)
    wg = make_group(_profiled(cfg, tmp_path))
    _get(wg.init_model())
    group = aprof.verl.worker_group(wg, "actor", cfg)
    assert [w.rank for w in group.selected] == [1]
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(group)
        for n in (1, 2):
            with prof.step(n):
                _get(wg.compute_log_prob())
                _get(wg.update_actor(2))

    save_path = tmp_path / "profile"
    (window,) = aprof.load_manifest(save_path).windows
    assert (window.step, window.state) == (2, "done")
    stages = ["actor_compute_log_prob", "actor_update"]
    assert [(c.rank, c.stage, c.state) for c in window.captures] == [
        (1, stage, "done") for stage in stages
    ]
    for capture in window.captures:
        (file,) = capture.files
        assert file.path == f"step_2/actor/rank_1/{capture.stage}-step2-rank1.pt.trace.json.gz"
        assert capture.stage in _ranges(save_path / file.path)
    # The inner actor's stage is a range of the update's capture, not a capture of its own.
    assert "train_batch" in _ranges(save_path / window.captures[1].files[0].path)
    assert not (save_path / "step_2" / "actor" / "rank_0").exists()


def test_inner_actor_steps_drive_the_mini_batch_schedule(
    make_group: MakeGroup, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, [1], ranks=[0], discrete=True)
    schedule = {"wait": 1, "active": 2, "repeat": 1, "stages": ["actor_update"]}
    cfg["tool_config"] = {"torch": {"schedule": schedule}}
    wg = make_group(_profiled(cfg, tmp_path))
    _get(wg.init_model())
    with aprof.BlockingProfiler(cfg) as prof:
        prof.add_target(aprof.verl.worker_group(wg, "actor", cfg))
        with prof.step(1):
            _get(wg.compute_log_prob())
            _get(wg.update_actor(4))

    save_path = tmp_path / "profile"
    (window,) = aprof.load_manifest(save_path).windows
    log_prob, update = window.captures
    assert (log_prob.stage, log_prob.state, len(log_prob.files)) == (
        "actor_compute_log_prob",
        "done",
        1,
    )
    assert (update.stage, update.state) == ("actor_update", "done")
    (file,) = update.files
    assert file.path == "step_1/actor/rank_0/actor_update-step1-rank0-mb1-2.pt.trace.json.gz"
    names = _ranges(save_path / file.path)
    assert {"mini_batch1", "mini_batch2"} <= names
    assert "mini_batch0" not in names and "mini_batch3" not in names


@pytest.mark.parametrize("how", ["spawn", "fused"])
def test_colocated_roles_capture_through_their_spawned_groups(
    make_group: MakeGroup, tmp_path: Path, how: str
) -> None:
    # Two roles share each process: discrete windows, whose stages follow each other.
    cfg = _config(tmp_path, [1], all_ranks=True, discrete=True)
    cfg["roles"]["ref"] = {"all_ranks": True, "discrete": True}
    roles = {"actor": _profiled(cfg, tmp_path, "actor"), "ref": _profiled(cfg, tmp_path, "ref")}
    colocate = create_colocated_worker_cls if how == "spawn" else create_colocated_worker_cls_fused
    wg = make_group(colocate(roles))
    with pytest.raises(TypeError, match="spawn"):
        aprof.verl.worker_group(wg, "actor", cfg)  # the colocated group itself
    spawned = wg.spawn(prefix_set={"actor", "ref"})
    for role_wg in spawned.values():
        _get(role_wg.init_model())
    with aprof.BlockingProfiler(cfg) as prof:
        for role, role_wg in spawned.items():
            prof.add_target(aprof.verl.worker_group(role_wg, role, cfg))
        with prof.step(1):
            _get(spawned["ref"].compute_log_prob())
            _get(spawned["actor"].compute_log_prob())
            _get(spawned["actor"].update_actor(2))

    save_path = tmp_path / "profile"
    windows = {w.target: w for w in aprof.load_manifest(save_path).windows}
    assert sorted(windows) == ["actor", "ref"]
    assert [(c.rank, c.stage, c.state) for c in windows["ref"].captures] == [
        (k, "actor_compute_log_prob", "done") for k in range(WORKERS)
    ]
    assert [(c.rank, c.stage, c.state) for c in windows["actor"].captures] == [
        (k, stage, "done")
        for k in range(WORKERS)
        for stage in ("actor_compute_log_prob", "actor_update")
    ]
    for window in windows.values():
        for capture in window.captures:
            (file,) = capture.files
            assert file.path.startswith(f"step_1/{window.target}/rank_{capture.rank}/")
            assert capture.stage in _ranges(save_path / file.path)
