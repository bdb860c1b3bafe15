"""docs/agentloop.md, fully-async: the first example's open profiler, client and runner."""
# ruff: noqa: F704 (top-level await: the docs' driver runs blocks as ``python -m asyncio`` does)

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import aprof
from agentloop import AgentLoopRunner, LLMClient, Sample, ToolAgentLoop, Trajectory, calculator
from servers.reference import ReferenceConfig, serve

Path("profile.yaml").write_text(
    "global_profiler: {steps: [1], save_path: outputs/profile}\nrollout: {replicas: all}\n"
)
# Left open: the servers, profiler and client live until the block's process ends.
opened = contextlib.AsyncExitStack()
urls = []
for seed in (0, 1):
    cfg = ReferenceConfig(profiling=False, model_name="m", seed=seed)
    urls.append((await opened.enter_async_context(serve(cfg))).url)
prof = await opened.enter_async_context(aprof.Profiler("profile.yaml"))
llm = await opened.enter_async_context(LLMClient(urls, model="m", prof=prof))
# Short answers: the page takes 256 trajectories a step.
runner = AgentLoopRunner(ToolAgentLoop(llm, [calculator], max_tokens=8), concurrency=64)
num_steps = 2


def endless_samples() -> Iterator[Sample]:
    return (Sample(f"s{i}", "What is 6 * 7? ") for i in itertools.count())


def train(trajectories: list[Trajectory]) -> None:
    assert trajectories and all(t.ok for t in trajectories), [t.error for t in trajectories]
