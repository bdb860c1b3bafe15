"""Every step accounted for, on a run of known structure: real reference servers, a trainer
stage, a pause with nothing running, one request held on purpose and one step made slow;
read back with ``aprof report --json`` (a real subprocess)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentloop_replicas import ReplicaFactory, Stall

import aprof
from agentloop import LLMClient
from aprof.testing import RecordingTarget

LIMIT_S = 120
PAUSE_S = 0.3
"""Each step's pause with nothing running."""
STAGE_S = 0.2
SLOW_EXTRA_S = 3.0
"""Step 6 pauses this much longer: many times a step's usual wall time."""
MakeConfig = Callable[..., aprof.ProfilerConfig]
ROOT = Path(__file__).resolve().parents[2]


async def test_every_step_says_where_its_time_went(
    replicas: ReplicaFactory, make_config: MakeConfig
) -> None:
    cfg = make_config(
        global_profiler={"steps": [2]}, rollout={"replicas": [0], "forward_steps": None}
    )
    paused: dict[int, float] = {}
    staged: dict[int, float] = {}
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2) as [fast, slow],
        aprof.Profiler(cfg) as prof,
        LLMClient([fast.url, slow.url], prof=prof) as llm,
    ):
        prof.add_target(RecordingTarget("replica_0", replica=0))

        async def batch(n: int, count: int) -> None:
            await asyncio.gather(
                *(
                    llm.generate("6 * 7?", max_tokens=2, prefer=0, request_id=f"s{n}-{i}")
                    for i in range(count)
                )
            )

        for n in range(1, 7):
            async with prof.step(n):
                if n == 3:  # the held request: sent first, answered after all the others
                    async with Stall(slow) as stall:
                        held = asyncio.create_task(
                            llm.generate("6 * 7?", max_tokens=2, prefer=1, request_id="held")
                        )
                        await stall.entered.wait()
                        await batch(n, 19)
                    await held
                else:
                    await batch(n, 8)
                began = time.monotonic()
                await asyncio.sleep(PAUSE_S + (SLOW_EXTRA_S if n == 6 else 0))
                paused[n] = time.monotonic() - began
                with prof.stage("update_actor"):
                    began = time.monotonic()
                    await asyncio.sleep(STAGE_S)
                    staged[n] = time.monotonic() - began

    report = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "aprof", "report", str(prof.save_path), "--json"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(LIMIT_S):
        out, err = await report.communicate()
    assert report.returncode == 0, err.decode()[-2000:]
    doc = json.loads(out)
    steps: dict[int, dict[str, Any]] = {s["step"]: s for s in doc["steps"]}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6]  # unprofiled steps too
    assert [n for n, s in steps.items() if s["profiled"]] == [2]
    for n, s in steps.items():
        phases = s["phases"]
        total = phases["rollout_s"] + phases["train_s"] - phases["overlap_s"] + phases["idle_s"]
        assert abs(total - s["wall_s"]) < 1e-3
        # Timeline stamps are whole µs: a span may lose up to 2 µs to rounding.
        assert phases["idle_s"] >= paused[n] - 1e-3, n
        assert phases["idle_s"] < paused[n] + staged[n], n  # the stage is no idle time
        assert phases["train_s"] >= staged[n] - 1e-3, n
        assert phases["overlap_s"] == 0  # training waited for the rollout here
        assert s["requests"]["count"] == (20 if n == 3 else 8)
        assert phases["rollout_s"] <= s["wall_s"]
        sum_of_latencies = sum(
            r["latency_s"] for r in s["requests"]["slowest"]
        )  # the five slowest alone
        if n != 3:
            assert phases["rollout_s"] < sum_of_latencies  # concurrent: a union, not a sum

    held = steps[3]["requests"]
    assert held["slowest"][0]["request_id"] == "held"
    assert held["slowest"][0]["replica"] == 1
    assert held["max_s"] == held["slowest"][0]["latency_s"]
    assert 0 < held["tail_s"] <= held["max_s"]
    replicas_3 = {r["replica"]: r for r in steps[3]["replicas"]}
    assert replicas_3[1]["requests"] == 1 and replicas_3[0]["requests"] == 19
    assert replicas_3[1]["busy_s"] == held["max_s"]

    flagged = {n: s["anomaly"] for n, s in steps.items() if s["anomaly"] is not None}
    assert list(flagged) == [6]
    assert flagged[6]["phase"] == "idle" and flagged[6]["factor"] > 2
    assert doc["summary"]["anomalies"] == [6]
    assert doc["summary"]["steps"] == 6
