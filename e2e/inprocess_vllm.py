"""Drive an in-process vLLM ``AsyncLLM`` through aprof with ``servers.engines.VLLMEngine``,
as verl drives its servers: ``generate`` with the request's id and no trace context, the
engine's request spans sent to the run's OTLP receiver.

Run as a script (``python inprocess_vllm.py MODEL OUT``): vLLM's engine core starts with
spawn, which re-imports the main module, so the work sits behind the ``__main__`` guard.
Writes aprof's output under ``OUT/profile`` and exits 0 once the run is over.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aprof
from servers.engines import VLLMEngine
from servers.process import free_port

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
    port = free_port()
    # What launch_spec sets for a vLLM server (docs/otel.md), here for the engine's process.
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "500"
    args = AsyncEngineArgs(
        model=model,
        dtype="float32",
        max_model_len=256,
        profiler_config=profiler,
        otlp_traces_endpoint=f"http://127.0.0.1:{port}/v1/traces",
    )
    engine = AsyncLLM.from_engine_args(args)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def generate(prof: aprof.Profiler, step: int, i: int) -> None:
        # As aprof's verl client does: the engine's request id is aprof's, no trace context.
        request_id = f"s{step}-r{i}"
        async with prof.request(replica=0, request_id=request_id):
            async for _ in engine.generate(f"hello world {i}", params, request_id=request_id):
                pass

    config = aprof.load_config(
        {
            "otel": {"receive": True, "port": port},
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
            async with asyncio.timeout(60):
                # Polled, bounded: the engine exports each request's span once it ends.
                while prof.manifest.otel is None or prof.manifest.otel.spans < 9:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
