"""One step at scale: ten thousand concurrent requests over 64 rollout replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aprof
from aprof.testing import RecordingTarget

REPLICAS = 64
REQUESTS = 10_000


async def test_ten_thousand_requests_over_64_replicas(tmp_path: Path) -> None:
    """10,000 racing requests in one step start and stop each of 64 replicas exactly once,
    and the manifest lists 64 ``done`` windows whose admitted requests add up to 10,000."""
    save = tmp_path / "profile"
    prof = aprof.Profiler(
        {
            "global_profiler": {"steps": [1], "save_path": str(save)},
            "rollout": {"replicas": "all", "forward_steps": None},
            "timeouts": {"connect_s": 5, "start_s": 30, "stop_s": 30, "poll_s": 0.05},
        }
    )
    targets = [RecordingTarget(f"replica_{r}", replica=r) for r in range(REPLICAS)]
    for t in targets:
        prof.add_target(t)

    async def request(i: int) -> aprof.Request:
        target = targets[i % REPLICAS]
        async with prof.request(replica=i % REPLICAS, request_id=f"r{i}") as req:
            target.advance(1)
            await asyncio.sleep(0)
            target.advance(1)
        return req

    async with prof, prof.step(1):
        handles = await asyncio.gather(*(request(i) for i in range(REQUESTS)))

    assert all(h.step == 1 and h.captured for h in handles)
    for t in targets:
        assert [w.step for w in t.starts] == [1], t.name
        assert [w.step for w in t.stops] == [1], t.name
    manifest = aprof.load_manifest(save)
    assert len(manifest.windows) == REPLICAS
    assert {w.target for w in manifest.windows} == {t.name for t in targets}
    assert all(w.step == 1 and w.state == "done" for w in manifest.windows)
    assert sum(w.requests.admitted for w in manifest.windows) == REQUESTS
    for w in manifest.windows:
        replica = int(w.target.removeprefix("replica_"))
        expected = len(range(replica, REQUESTS, REPLICAS))
        assert w.requests.admitted == expected, w.target
