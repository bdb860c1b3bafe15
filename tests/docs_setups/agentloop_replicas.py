"""docs/agentloop.md: two reference servers serving model "m", a profile and the trainer's names."""
# ruff: noqa: F704 (top-level await: the docs' driver runs blocks as ``python -m asyncio`` does)

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

from agentloop import Sample, Trajectory
from servers.reference import ReferenceConfig, serve

Path("profile.yaml").write_text(
    "global_profiler: {steps: [1], save_path: outputs/profile}\nrollout: {replicas: all}\n"
)
# Left open: the servers serve until the block's process ends.
replicas = contextlib.AsyncExitStack()
urls = []
for seed in (0, 1):
    cfg = ReferenceConfig(profiling=False, model_name="m", seed=seed)
    urls.append((await replicas.enter_async_context(serve(cfg))).url)
num_steps = 2


def samples_of_step(n: int) -> list[Sample]:
    return [Sample(f"s{n}-{i}", "What is 6 * 7? ") for i in range(4)]


def endless_samples() -> Iterator[Sample]:
    return (Sample(f"s{i}", "What is 6 * 7? ") for i in itertools.count())


def train(trajectories: list[Trajectory]) -> None:
    assert trajectories and all(t.ok for t in trajectories), [t.error for t in trajectories]
