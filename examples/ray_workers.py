"""Profile Ray actor workers from the trainer's driver, on CPU.

Each actor is an engine worker in the shape of verl's ActorRolloutRefWorker: its profiler is
made in the constructor (``aprof.ray.ProfilerMixin``), and ``compute_log_prob`` and
``update_actor`` are stages. The driver runs the training steps under an ``aprof.Profiler``
whose target is the actors' worker group: the selected ranks capture the selected steps.

Run: python examples/ray_workers.py --out outputs/ray --steps 1,2 --num-steps 3 --workers 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

import ray
import torch
from torch import nn

import aprof
import aprof.ray

VOCAB, HIDDEN, BATCH = 8, 32, 16


def log_probs(model: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    logits = model(obs)
    return torch.log_softmax(logits, dim=-1).gather(1, actions[:, None]).squeeze(1)


class EngineWorker(aprof.ray.ProfilerMixin):
    """One data-parallel rank of the actor role: a tiny policy trained on its shard."""

    def __init__(self, config: dict[str, Any], rank: int, world_size: int) -> None:
        torch.set_num_threads(1)  # several actors on a small CPU machine
        self.init_profiler(config, role="actor", rank=rank, world_size=world_size)
        torch.manual_seed(0)  # every rank starts from the same weights
        self.model = nn.Sequential(nn.Linear(16, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, VOCAB))
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    @aprof.staged("compute_log_prob")
    def compute_log_prob(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return log_probs(self.model, batch["obs"], batch["actions"])

    @aprof.staged("update_actor")
    def update_actor(self, batch: dict[str, torch.Tensor], old: torch.Tensor) -> float:
        new = log_probs(self.model, batch["obs"], batch["actions"])
        ratio = torch.exp(new - old)
        loss = -(ratio * batch["advantages"]).mean()
        torch.autograd.backward(loss)
        self.optim.step()
        self.optim.zero_grad()
        return float(loss.detach())


def shard(step: int, rank: int) -> dict[str, torch.Tensor]:
    """The batch rank ``rank`` trains on at ``step``."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return {
        "obs": torch.randn(BATCH, 16, generator=generator),
        "actions": torch.randint(0, VOCAB, (BATCH,), generator=generator),
        "advantages": torch.randn(BATCH, generator=generator),
    }


async def train(args: argparse.Namespace, config: dict[str, Any], actors: list[Any]) -> None:
    """The driver: every step calls each rank's stages; the profiler drives the captures."""
    group = aprof.ray.worker_group("actor", actors, config)
    async with aprof.Profiler(config) as prof:
        prof.add_target(group)
        for step in range(1, args.num_steps + 1):
            async with prof.step(step):
                updates = []
                for rank, actor in enumerate(actors):
                    batch = shard(step, rank)
                    old = actor.compute_log_prob.remote(batch)
                    updates.append(actor.update_actor.remote(batch, old))
                losses = await asyncio.gather(*updates)
            print(f"step {step}: loss {sum(losses) / len(losses):.4f}", flush=True)

    print(f"traces in {prof.save_path}:")
    for window in prof.manifest.windows:
        for capture in window.captures:
            what = ", ".join(f.path for f in capture.files) or capture.error
            print(f"  step {window.step} rank {capture.rank} {capture.state:6} {what}")


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="save_path of the traces")
    parser.add_argument("--steps", type=int_list, default=[1, 2], help="profiled steps: 1,2")
    parser.add_argument("--num-steps", type=int, default=3, help="training steps to run")
    parser.add_argument("--workers", type=int, default=2, help="actors (ranks)")
    parser.add_argument("--ranks", type=int_list, default=[0], help="profiled ranks: 0,1")
    parser.add_argument("--mode", choices=["e2e", "discrete"], default="e2e")
    args = parser.parse_args()
    config = {
        "global_profiler": {
            "steps": args.steps,
            "save_path": str(args.out.resolve()),
        },
        "roles": {"actor": {"ranks": args.ranks, "discrete": args.mode == "discrete"}},
    }

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
    ray.init(num_cpus=max(2, args.workers), include_dashboard=False)
    try:
        remote_worker = ray.remote(EngineWorker)
        world_size = args.workers
        actors = [remote_worker.remote(config, rank, world_size) for rank in range(world_size)]
        asyncio.run(train(args, config, actors))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
