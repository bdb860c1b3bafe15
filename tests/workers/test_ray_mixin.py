"""aprof.ray without a cluster: the actor mixin called in-process, and Ray missing."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest

import aprof
import aprof.ray

MakeConfig = Callable[..., aprof.ProfilerConfig]


class Worker(aprof.ray.ProfilerMixin):
    """An actor class as a user writes it, here called directly instead of through Ray."""

    def __init__(self, cfg: aprof.ProfilerConfig, rank: int) -> None:
        self.init_profiler(cfg, role="actor", rank=rank, world_size=2)

    @aprof.staged("update_actor")
    def update_actor(self) -> None:
        import torch

        torch.ones(4).sum()


def test_mixin_begin_and_end_return_plain_records(make_config: MakeConfig) -> None:
    pytest.importorskip("torch")
    cfg = make_config(global_profiler={"steps": [2]}, roles={"actor": {"all_ranks": True}})
    worker = Worker(cfg, rank=1)
    worker.aprof_begin(2, rank=1)
    worker.update_actor()
    records = worker.aprof_end()

    json.dumps(records)  # plain data: any pickler, any version of aprof's classes
    (capture,) = [aprof.WorkerCapture.from_record(r) for r in records]
    assert capture == worker.profiler.captures[0]
    assert (capture.step, capture.rank, capture.state) == (2, 1, "done")
    assert capture.files[0].path == "step_2/actor/rank_1/actor-step2-rank1.pt.trace.json.gz"
    assert worker.aprof_end() == []  # nothing opened since


def test_mixin_refuses_a_rank_the_driver_does_not_expect(make_config: MakeConfig) -> None:
    worker = Worker(make_config(roles={"actor": {}}), rank=1)
    expected = "the driver holds this actor as rank 0, its profiler has rank 1"
    with pytest.raises(ValueError, match=expected):
        worker.aprof_begin(1, rank=0)
    assert worker.profiler.captures == []


def test_mixin_without_init_profiler_says_what_to_do() -> None:
    class Forgetful(aprof.ray.ProfilerMixin):
        pass

    with pytest.raises(RuntimeError, match=r"call self\.init_profiler\(\.\.\.\)"):
        Forgetful().aprof_begin(1, rank=0)


def test_worker_group_without_ray_names_the_extra(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.actor", None)
    with pytest.raises(ImportError, match=r"pip install 'aprof\[ray\]'"):
        aprof.ray.worker_group("actor", [], make_config(roles={"actor": {}}))
