"""Shared pieces of the adapter tests: the profiled steps, their config, a test window."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import aprof
from servers.reference import ReferenceServer

if TYPE_CHECKING:
    from conftest import Complete

STEPS = [1, 2, 5]
TIMEOUTS = {"start_s": 30, "stop_s": 30, "poll_s": 0.005, "connect_s": 5}


def config(save: Path, **rollout: Any) -> aprof.ProfilerConfig:
    """Steps [1, 2, 5] of 6, 4 forward steps each. Each step waits for its stop: a window
    queued behind the previous stop would not gate the next step's request (by design)."""
    return aprof.load_config(
        {
            "global_profiler": {"steps": STEPS, "save_path": str(save), "wait_for_stops": True},
            "rollout": {"forward_steps": 4, **rollout},
            "timeouts": TIMEOUTS,
        }
    )


async def run_steps(
    prof: aprof.Profiler, server: ReferenceServer, complete: Complete, *, max_tokens: int = 12
) -> None:
    """Global steps 1..6, one completion on replica 0 in each."""
    async with prof:
        for n in range(1, 7):
            async with prof.step(n), prof.request(replica=0):
                await complete(server, max_tokens=max_tokens)


def window(
    folder: Path, *, step: int = 1, delay: int = 0, forward_steps: int | None = 4
) -> aprof.Window:
    folder.mkdir(parents=True, exist_ok=True)
    return aprof.Window(
        step=step,
        target="replica_0",
        kind="rollout",
        delay=delay,
        forward_steps=forward_steps,
        dir=folder,
        prefix=f"replica_0-step{step}-test",
    )


def answered(logs: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    """The ``server answered`` log events of requests to ``path``."""
    return [e for e in logs if e["event"] == "server answered" and e["path"] == path]
