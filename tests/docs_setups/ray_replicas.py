"""docs/distributed.md: two reference servers, a profile and the trainer's names, for Ray actors."""
# ruff: noqa: F704 (top-level await: the docs' driver runs blocks as ``python -m asyncio`` does)

import contextlib
import os
from pathlib import Path

from agentloop import Sample, Trajectory
from servers.reference import ReferenceConfig, serve

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
Path("profile.yaml").write_text(
    "global_profiler: {steps: [1], save_path: outputs/profile}\nrollout: {replicas: all}\n"
)
# Left open: the servers serve until the block's process ends.
replicas = contextlib.AsyncExitStack()
urls = []
for seed in (0, 1):
    cfg = ReferenceConfig(profiling=False, seed=seed)
    urls.append((await replicas.enter_async_context(serve(cfg))).url)
num_steps = 2


def samples(n: int, k: int) -> list[Sample]:
    return [Sample(f"s{n}-{k}-{i}", "What is 6 * 7? ") for i in range(2)]


def train(batches: list[list[Trajectory]]) -> None:
    trajectories = [t for batch in batches for t in batch]
    assert trajectories and all(t.ok for t in trajectories), [t.error for t in trajectories]
