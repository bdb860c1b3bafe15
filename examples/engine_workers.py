"""Profile engine workers: a 2-process torch.distributed (gloo) FSDP2 job on CPU.

An ``actor`` role (``compute_log_prob``, ``update_actor``) and a ``ref`` role
(``compute_ref_log_prob``) run in every rank; the selected ranks capture the selected steps.

Run: python examples/engine_workers.py --out outputs/workers --steps 1,2 --num-steps 3 \
    --world-size 2 --ranks 0 --mode e2e
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

from aprof import WorkerProfiler, staged

VOCAB, HIDDEN, BATCH = 8, 32, 16
JOB_TIMEOUT_S = 300.0


def policy(mesh: DeviceMesh, seed: int) -> nn.Module:
    """A tiny policy over VOCAB tokens, sharded with FSDP2 over the CPU mesh."""
    torch.manual_seed(seed)  # every rank builds the same weights before sharding
    model = nn.Sequential(nn.Linear(16, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, VOCAB))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def log_probs(model: nn.Module, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    logits = model(obs)
    return torch.log_softmax(logits, dim=-1).gather(1, actions[:, None]).squeeze(1)


class ActorWorker:
    """The actor role, in the shape of verl's engine worker: profiler made in the constructor."""

    def __init__(self, config: dict[str, Any], mesh: DeviceMesh) -> None:
        self.profiler = WorkerProfiler(config, role="actor")
        self.model = policy(mesh, seed=0)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-2)

    @staged("compute_log_prob")
    def compute_log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return log_probs(self.model, obs, actions)

    @staged("update_actor")
    def update_actor(
        self, obs: torch.Tensor, actions: torch.Tensor, old: torch.Tensor, ref: torch.Tensor
    ) -> float:
        new = log_probs(self.model, obs, actions)
        advantages = old - ref  # a stand-in for real advantages: any fixed signal will do
        loss = -(torch.exp(new - old) * advantages).mean() + 0.1 * (new - ref).pow(2).mean()
        torch.autograd.backward(loss)
        self.optim.step()
        self.optim.zero_grad()
        return float(loss.detach())


class RefWorker:
    """The reference policy: forward passes only."""

    def __init__(self, config: dict[str, Any], mesh: DeviceMesh) -> None:
        self.profiler = WorkerProfiler(config, role="ref")
        self.model = policy(mesh, seed=1)

    @staged("compute_ref_log_prob")
    def compute_ref_log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return log_probs(self.model, obs, actions)


def worker(rank: int, args: argparse.Namespace) -> None:
    """One rank: the training loop, with each role's window around its own work."""
    torch.set_num_threads(1)  # two ranks on a small CPU machine
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    try:
        mesh = init_device_mesh("cpu", (args.world_size,))
        discrete = args.mode == "discrete"
        config = {
            "global_profiler": {"steps": args.steps, "save_path": str(args.out)},
            "roles": {
                "actor": {"ranks": args.ranks, "discrete": discrete},
                "ref": {"ranks": args.ranks, "discrete": discrete},
            },
        }
        actor, ref = ActorWorker(config, mesh), RefWorker(config, mesh)
        generator = torch.Generator().manual_seed(1234 + rank)
        for step in range(1, args.num_steps + 1):
            obs = torch.randn(BATCH, 16, generator=generator)
            actions = torch.randint(0, VOCAB, (BATCH,), generator=generator)
            # torch.profiler allows one capture per process: the two roles' windows follow
            # each other, as when a driver calls each worker group in turn.
            with ref.profiler.global_step(step):
                ref_lp = ref.compute_ref_log_prob(obs, actions)
            with actor.profiler.global_step(step):
                old_lp = actor.compute_log_prob(obs, actions)
                loss = actor.update_actor(obs, actions, old_lp, ref_lp)
            if rank == 0:
                print(f"step {step}: loss {loss:.4f}", flush=True)
        actor.profiler.close()
        ref.profiler.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def rank_main(rank: int, args: argparse.Namespace) -> None:
    """A rank's process: ``worker``, then out without the interpreter's teardown, where gloo's
    threads can abort a rank whose process group is gone (SIGABRT, "terminate called without
    an active exception": once in about 25 runs on a loaded 2-core machine; pytorch#179291
    describes the mechanism). What the rank wrote is on disk by then."""
    try:
        worker(rank, args)
    except BaseException:
        traceback.print_exc()
        code = 1
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="save_path of the traces")
    parser.add_argument("--steps", type=int_list, default=[1, 2], help="profiled steps: 1,2")
    parser.add_argument("--num-steps", type=int, default=3, help="training steps to run")
    parser.add_argument("--world-size", type=int, default=2, help="processes (ranks)")
    parser.add_argument("--ranks", type=int_list, default=[0], help="profiled ranks: 0,1")
    parser.add_argument("--mode", choices=["e2e", "discrete"], default="e2e")
    args = parser.parse_args()
    args.out = args.out.resolve()

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=rank_main, args=(r, args)) for r in range(args.world_size)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():  # a rank stuck at a collective after its peer died
            process.terminate()
            process.join()
    failed = [f"rank {r}: exit code {p.exitcode}" for r, p in enumerate(ranks) if p.exitcode]
    if failed:
        sys.exit("training failed: " + "; ".join(failed))

    print(f"traces in {args.out}:")
    # Each profiled rank folder holds captures.json: its wp.captures (see docs/workers.md).
    for report in sorted(args.out.rglob("captures.json")):
        for capture in json.loads(report.read_text()):
            files = ", ".join(f["path"] for f in capture["files"]) or capture["error"]
            print(f"  {capture['state']:6} {files}")


if __name__ == "__main__":
    main()
