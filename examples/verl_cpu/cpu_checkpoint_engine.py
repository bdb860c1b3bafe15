"""A ``cpu_gloo`` checkpoint engine: verl's actor-to-rollout weight sync over gloo, on CPU.

verl 0.9.1's ``separate_async`` trainer sends weights from the actor to standalone rollout
replicas through a checkpoint engine, and registers only NCCL-family ones (``nccl``, ``nixl``,
``hccl``, ...), none of which runs without an accelerator. This one has the NCCL engine's shape:
actor rank 0 broadcasts the weights in buckets to every rollout worker; the other actor ranks
walk the weight generator (producing each weight is collective over the actor group) and send
nothing.

The transport is a gloo process group of its own (``ProcessGroupGloo`` over a ``TCPStore`` that
actor rank 0 serves): every process already holds a default gloo group over its own workers, and
``new_group`` cannot span the actor and rollout processes. Gloo keeps the weights as tensors end
to end and broadcasts to all receivers at once, where ZMQ would need a socket and a copy per
receiver. The group is built for each sync and dropped after it, as verl's manager asks
(``prepare`` → ``build_topology`` → ``init_process_group`` → send/receive → ``finalize``).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from datetime import timedelta
from typing import Any

import ray
import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

TIMEOUT = timedelta(seconds=300)
"""Bound on the rendezvous and on each broadcast: a peer that died fails the sync."""
ALIGN = 16
"""Byte alignment of each chunk in a bucket, so the receiver can view it as any dtype."""


@CheckpointEngineRegistry.register("cpu_gloo")
class CpuGlooCheckpointEngine(CheckpointEngine):  # type: ignore[misc]
    """Weights from actor rank 0 to every rollout worker, ``bucket_size`` bytes at a time."""

    def __init__(self, bucket_size: int, is_master: bool = False) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.rank = -1
        self.store: dist.TCPStore | None = None
        self.group: dist.ProcessGroupGloo | None = None

    def prepare(self) -> dict[str, Any]:
        """Actor rank 0 serves this sync's rendezvous store and reports its address."""
        if not self.is_master:
            return {}
        host = ray.util.get_node_ip_address().strip("[]")
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        return {"host": host, "port": self.store.port}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Rank 0 is actor rank 0, the rollout workers follow; other actor ranks stay out (-1)."""
        master = metadata[0]
        world_size = 1 + rollout_world_size
        actor: dict[str, list[Any]] = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master": [master] * actor_wg_world_size,
        }
        rollout: dict[str, list[Any]] = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: dict[str, Any]) -> None:
        """Join this sync's gloo group (collective: returns once every member has joined)."""
        self.rank = rank
        if rank < 0:
            return
        if self.store is None:
            self.store = dist.TCPStore(
                master["host"], master["port"], is_master=False, timeout=TIMEOUT
            )
        self.group = dist.ProcessGroupGloo(self.store, rank, world_size, TIMEOUT)

    def finalize(self) -> None:
        """Drop the group and the store: the next sync builds new ones."""
        self.group = None
        self.store = None
        self.rank = -1

    @torch.no_grad()
    async def send_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None
    ) -> None:
        """Broadcast ``weights`` bucket by bucket (actor rank 0); drain them (other actor ranks)."""
        if self.group is None:
            async for _ in ensure_async_iterator(weights):
                pass
            return
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        metas: list[TensorMeta] = []
        offset = 0
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + meta.chunk_size > self.bucket_size:
                await asyncio.to_thread(self._send_bucket, bucket[:offset], metas, False)
                metas, offset = [], 0
            meta.offset = offset
            bucket[offset : offset + meta.chunk_size] = chunk
            metas.append(meta)
            offset = min(-(-(offset + meta.chunk_size) // ALIGN) * ALIGN, self.bucket_size)
        await asyncio.to_thread(self._send_bucket, bucket[:offset], metas, True)

    @torch.no_grad()
    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """The weights actor rank 0 broadcasts, whole, as ``(name, tensor)`` (rollout workers)."""
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight

    async def _receive_chunks(self) -> AsyncIterator[tuple[TensorMeta, torch.Tensor]]:
        is_last = False
        while not is_last:
            # a fresh buffer per bucket: what was yielded from the last one may still be read
            payload, metas, is_last = await asyncio.to_thread(self._receive_bucket)
            for meta in metas:
                yield meta, payload[meta.offset : meta.offset + meta.chunk_size]

    def _broadcast(self, tensor: torch.Tensor) -> None:
        assert self.group is not None, "init_process_group first"
        if tensor.numel():  # both sides know the size: an empty bucket is not sent
            self.group.broadcast(tensor, 0, TIMEOUT).wait()

    def _send_bucket(self, payload: torch.Tensor, metas: list[TensorMeta], is_last: bool) -> None:
        header = torch.frombuffer(bytearray(pickle.dumps((metas, is_last))), dtype=torch.uint8)
        self._broadcast(torch.tensor([header.numel(), payload.numel()], dtype=torch.int64))
        self._broadcast(header)
        self._broadcast(payload)

    def _receive_bucket(self) -> tuple[torch.Tensor, list[TensorMeta], bool]:
        sizes = torch.empty(2, dtype=torch.int64)
        self._broadcast(sizes)
        header = torch.empty(int(sizes[0]), dtype=torch.uint8)
        self._broadcast(header)
        payload = torch.empty(int(sizes[1]), dtype=torch.uint8)
        self._broadcast(payload)
        metas, is_last = pickle.loads(header.numpy().tobytes())
        return payload, metas, is_last
