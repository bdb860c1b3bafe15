"""Stand-ins for docs/workers.md's mini-batch loop: an actor inside global step 2 (the config
below the loop on that page selects it), its mini-batches and a training step on CPU."""

import torch

import aprof

config = aprof.load_config(
    """
global_profiler: {steps: [2], save_path: outputs/schedule, tool: torch}
roles:
  actor: {discrete: true}
tool_config:
  torch:
    schedule: {skip_first: 0, wait: 1, warmup: 1, active: 2, repeat: 1, stages: [update_actor]}
"""
)


class Actor:
    def __init__(self) -> None:
        self.profiler = aprof.WorkerProfiler(config, role="actor", rank=0)


actor = Actor()
actor.profiler.begin_step(2)  # the loop runs inside the step; its capture ends with the stage
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
mini_batches = [torch.randn(4, 8) for _ in range(4)]


def train_on(mini_batch: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(mini_batch).square().mean().backward()
    optimizer.step()
