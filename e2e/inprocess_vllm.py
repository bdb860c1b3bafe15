"""Drive an in-process vLLM ``AsyncLLM`` through aprof with ``servers.engines.VLLMEngine``.

Run as a script (``python inprocess_vllm.py MODEL OUT``): vLLM's engine core starts with
spawn, which re-imports the main module, so the work sits behind the ``__main__`` guard.
Writes aprof's output under ``OUT/profile`` and exits 0 once the run is over.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aprof
from servers.engines import VLLMEngine

STEPS = [1, 3]
FORWARD_STEPS = 3
MAX_TOKENS = 8


async def main(model: str, out: Path) -> None:
    """Two profiled steps out of three, each with concurrent generations on the engine."""
    from vllm import SamplingParams
    from vllm.config import ProfilerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    profiler = ProfilerConfig(
        profiler="torch",
        torch_profiler_dir=str(out / "engine_traces"),
        torch_profiler_with_stack=False,
        torch_profiler_activities=["CPU"],
        # Its front-end profiler starts and stops on different threads: torch segfaults.
        ignore_frontend=True,
    )
    args = AsyncEngineArgs(
        model=model, dtype="float32", max_model_len=256, profiler_config=profiler
    )
    engine = AsyncLLM.from_engine_args(args)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def generate(prof: aprof.Profiler, step: int, i: int) -> None:
        async with prof.request(replica=0, request_id=f"s{step}-r{i}"):
            async for _ in engine.generate(f"hello world {i}", params, request_id=f"{step}-{i}"):
                pass

    config = aprof.load_config(
        {
            "global_profiler": {"steps": STEPS, "save_path": str(out / "profile")},
            "rollout": {"forward_steps": FORWARD_STEPS},
            "timeouts": {"start_s": 60, "stop_s": 120},
            "strict": True,
        }
    )
    try:
        async with aprof.Profiler(config) as prof:
            prof.add_target(VLLMEngine(engine, replica=0))
            for step in range(1, 4):
                async with prof.step(step):
                    await asyncio.gather(*(generate(prof, step, i) for i in range(3)))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
