"""A test driver for on-demand capture: 30 short global steps of a real pipeline, none selected
by its config, for ``aprof capture`` to add steps to from other processes.

Two reference servers (subprocesses, vLLM dialect, real ``/start_profile``) serve the agent
loops' requests; the ``trainer`` role is the demo's trainer process (a real torch capture in a
process of its own), driven as a worker group. After step ``--pause`` the driver writes
``paused`` beside SAVE_PATH and waits (bounded) for a ``go`` file there, so the test can place
its requests between two steps.

Usage: python capture_driver.py SAVE_PATH [--steps 30] [--pause 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
from pathlib import Path

import aprof
from agentloop import AgentLoopRunner, LLMClient, Sample, SingleTurnLoop
from aprof.cli._demo_trainer import TrainerProcess
from servers import launch, launch_spec
from servers.process import free_port

GO_WAIT_S = 120.0


async def main(save_path: Path, steps: int, pause: int) -> None:
    config = aprof.load_config(
        {
            "global_profiler": {"steps": [], "save_path": str(save_path), "wait_for_stops": True},
            "rollout": {"replicas": "all", "forward_steps": 2},
            "roles": {"trainer": {}},
            "log": {"level": "warning"},
        }
    )
    marks = save_path.parent
    logs = marks / "logs"
    async with contextlib.AsyncExitStack() as stack:
        trainer = stack.enter_context(TrainerProcess(config, logs / "trainer.log"))
        specs = [
            launch_spec("reference", config, version="0.32.0", port=free_port()) for _ in range(2)
        ]
        for r, spec in enumerate(specs):
            server = await launch(spec, log_path=logs / f"replica_{r}.log")
            stack.push_async_callback(server.aclose)
        await trainer.ready()
        prof = aprof.Profiler(config)
        for r, spec in enumerate(specs):
            prof.add_target(spec.adapter(replica=r))
        prof.add_target(aprof.WorkerGroup("trainer", [trainer], config))
        await stack.enter_async_context(prof)
        llm = await stack.enter_async_context(
            LLMClient([spec.base_url for spec in specs], prof=prof, timeout_s=60.0)
        )
        runner = AgentLoopRunner(SingleTurnLoop(llm, max_tokens=4), concurrency=4)
        samples = (Sample(id=f"s{i}", prompt=f"count to {i}: ") for i in itertools.count())
        for n in range(1, steps + 1):
            async with prof.step(n):
                batch = await runner.run_batch(itertools.islice(samples, 4))
                await trainer.update(
                    [t.response for t in batch if t.ok], [1.0 for t in batch if t.ok]
                )
            if n == pause:
                (marks / "paused").write_text(str(n))
                async with asyncio.timeout(GO_WAIT_S):
                    while not (marks / "go").exists():  # noqa: ASYNC110 (another process writes it)
                        await asyncio.sleep(0.05)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("save_path", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pause", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.save_path, args.steps, args.pause))
    sys.exit(0)
