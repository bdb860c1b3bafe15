"""A capture target driven on the node where its server runs: ``placed(target, node_id)``.

A server's target reads and moves the trace files its server writes (vLLM's trace folder,
SGLang's output), which on a cluster without shared storage only its own node sees. Placed,
the target itself lives in a Ray actor on that node (no CPU), and the driver's profiler drives
a stand-in whose every call is the actor's: the windows' folders are made there, the files
land in that node's ``save_path``, and their sizes come back with the result (collected at
close, ``cluster.collect``).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from aprof._capture import CaptureResult, TargetKind, Window
from aprof._config import LimitsConfig, TimeoutsConfig
from aprof._core.host import host_name
from aprof._layout import size_of
from aprof._safe_files import open_folder
from aprof.abc import ManagedTarget


class TargetHost:
    """The Ray actor holding a placed target, on its server's node."""

    def __init__(self, target: Any) -> None:
        self._target = target

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig) -> None:
        if isinstance(self._target, ManagedTarget):
            await self._target.open(timeouts, limits)

    async def start(self, window: Window) -> None:
        # The driver made the window's folder on its own disk: this node needs its own, made
        # below save_path without following a link (the profiler's windows all name it).
        if window.root is not None:
            parts = window.dir.relative_to(window.root).parts
            os.close(open_folder(str(window.root), parts, create=True))
        await self._target.start(window)

    async def stop(self, window: Window) -> CaptureResult:
        result: CaptureResult = await self._target.stop(window)
        root = window.root or Path("/")
        sizes = tuple(size_of(p if p.is_absolute() else root / p) for p in result.files)
        return dataclasses.replace(result, host=host_name(), sizes=sizes)

    async def forward_steps(self) -> int | None:
        count: int | None = await self._target.forward_steps()
        return count

    async def aclose(self) -> None:
        if isinstance(self._target, ManagedTarget):
            await self._target.aclose()


class PlacedTarget:
    """The driver's stand-in for a target that runs on another node (see the module)."""

    def __init__(self, target: Any, node_id: str) -> None:
        self._target = target
        self.node_id = node_id
        self.name: str = target.name
        self.kind: TargetKind = target.kind
        self.replica: int | None = target.replica
        self.enforces_window: bool = target.enforces_window
        for optional in ("role", "rank", "tool"):
            if hasattr(target, optional):
                setattr(self, optional, getattr(target, optional))
        self._host: Any = None

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig) -> None:
        """Start the actor on the target's node and open the target there."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        there = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        self._host = (
            ray.remote(TargetHost)
            .options(num_cpus=0, scheduling_strategy=there)
            .remote(self._target)
        )
        await self._host.open.remote(timeouts, limits)

    async def start(self, window: Window) -> None:
        await self._host.start.remote(window)

    async def stop(self, window: Window) -> CaptureResult:
        result: CaptureResult = await self._host.stop.remote(window)
        return result

    async def forward_steps(self) -> int | None:
        count: int | None = await self._host.forward_steps.remote()
        return count

    async def aclose(self) -> None:
        """Close the target on its node and end the actor."""
        if self._host is None:
            return
        import ray

        try:
            await self._host.aclose.remote()
        finally:
            ray.kill(self._host)


def placed(target: Any, node_id: str) -> PlacedTarget:
    """``target`` (a server's capture target) driven on the Ray node ``node_id``, where its
    server writes its traces: add what this returns to the driver's profiler instead."""
    return PlacedTarget(target, node_id)
