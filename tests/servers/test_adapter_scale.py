"""32 reference-server windows in one step, from one process.

32 reference servers run in this process on 127.0.0.1 (even replicas vLLM 0.32, odd ones
SGLang), each a replica with its own adapter and HTTP session. All 32 windows are open at
once and all 32 stops run together at the end of the step. The requests go one replica at a
time: torch runs one profiler per process, and two captures recording at once in one process
crash it (seen with torch 2.13), so each server's capture must have ended on its own
(auto-stop after 4 forward steps) before the next replica's request starts one.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

import aprof
from aprof.testing import assert_windows
from servers import SGLangServer, VLLMServer
from servers.reference import ReferenceConfig, ReferenceServer, forward_step_numbers, serve

REPLICAS = 32


def target(replica: int, server: ReferenceServer) -> VLLMServer | SGLangServer:
    if server.cfg.dialect == "vllm":
        return VLLMServer(server.url, replica=replica, profiler_dir=server.profiler_dir)
    return SGLangServer(server.url, replica=replica)


async def test_32_windows_in_one_step(tmp_path: Path) -> None:
    save = tmp_path / "profile"
    prof = aprof.Profiler(
        {
            "global_profiler": {"steps": [1], "save_path": str(save)},
            "rollout": {"replicas": "all", "forward_steps": 4},
            "timeouts": {"start_s": 60, "stop_s": 60, "poll_s": 0.01, "connect_s": 10},
        }
    )
    async with asyncio.timeout(300), contextlib.AsyncExitStack() as stack:
        servers = []
        for replica in range(REPLICAS):
            cfg = ReferenceConfig(
                dialect="vllm" if replica % 2 == 0 else "sglang",
                profiler_dir=tmp_path / f"traces_{replica}",
            )
            servers.append(await stack.enter_async_context(serve(cfg)))
        for replica, server in enumerate(servers):
            prof.add_target(target(replica, server))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        async with prof, prof.step(1):
            for replica, server in enumerate(servers):
                body = {"model": server.cfg.model_name, "prompt": "hi", "max_tokens": 8}
                async with (
                    prof.request(replica=replica),
                    http.post(f"{server.url}/v1/completions", json=body) as response,
                ):
                    assert response.status == 200, await response.text()
    done = {"step": 1, "state": "done", "stop_reason": "auto_stop", "forward_steps.observed": 4}
    assert_windows(prof.manifest, [{"target": f"replica_{r}", **done} for r in range(REPLICAS)])
    for replica in range(REPLICAS):
        folder = save / "step_1" / "rollout" / f"replica_{replica}"
        record = prof.manifest.window(1, f"replica_{replica}")
        assert record is not None and record.files
        assert all(f.path.startswith(f"step_1/rollout/replica_{replica}/") for f in record.files)
        # vLLM's front-end trace holds requests, not forward steps.
        traces = [p for p in folder.glob("*.trace.json.gz") if "async_llm" not in p.name]
        assert len(traces) == 1
        assert forward_step_numbers(traces[0]) == [1, 2, 3, 4]
