"""A server's target placed on a Ray node (``aprof.ray.placed``): driven there, through an
actor, its files' sizes told by that node; and a shared run on one node, whose manifest lists
its files on one host and measures no clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aprof
import aprof.ray
from aprof.testing import RecordingTarget

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")

pytestmark = pytest.mark.usefixtures("ray_cluster")

MakeConfig = Callable[..., aprof.ProfilerConfig]
LIMIT_S = 120


@pytest.fixture
def cfg(make_config: MakeConfig) -> aprof.ProfilerConfig:
    """Step 1 profiled, its window open until the step ends."""
    return make_config(
        global_profiler={"steps": [1]},
        rollout={"forward_steps": None},
        # Bounds, not waits: the target's actor (and the hub) start in a fresh Ray worker
        # process, which on a busy machine takes seconds.
        timeouts={"start_s": 60, "connect_s": 30},
    )


async def test_a_placed_target_captures_on_its_node_and_reports_its_files(
    cfg: aprof.ProfilerConfig,
) -> None:
    here = ray.get_runtime_context().get_node_id()
    target = aprof.ray.placed(RecordingTarget("replica_0", replica=0), here)
    assert (target.name, target.kind, target.replica) == ("replica_0", "rollout", 0)
    async with asyncio.timeout(LIMIT_S):
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(target)
            aprof.ray.share(prof)
            async with prof.step(1), prof.request(replica=0) as req:
                assert req.captured
    (window,) = prof.manifest.windows
    assert window.state == "done", window
    (written,) = window.files
    on_disk = cfg.global_profiler.save_path / written.path
    assert written.bytes == on_disk.stat().st_size > 0  # the size the node told
    assert not [n for n in prof.manifest.notes if "missing" in n.text]
    # One node: every file is the driver's host's, its clock the only one, at 0.
    (host,) = prof.manifest.hosts
    assert (host.offset_ns, host.uncertainty_ns) == (0, 0)
    listed = {f.path: f for f in prof.manifest.files}
    assert written.path in listed and {f.host for f in listed.values()} == {host.host}
    assert listed[written.path].bytes == written.bytes
    assert any(p.startswith("timeline/") for p in listed)
    assert aprof.load_manifest(cfg.global_profiler.save_path).files == prof.manifest.files


async def test_a_placed_target_whose_start_fails_fails_its_window(
    cfg: aprof.ProfilerConfig,
) -> None:
    here = ray.get_runtime_context().get_node_id()
    target = aprof.ray.placed(RecordingTarget("replica_0", replica=0, fail_start=True), here)
    async with asyncio.timeout(LIMIT_S):
        async with aprof.Profiler(cfg) as prof:
            prof.add_target(target)
            async with prof.step(1), prof.request(replica=0) as req:
                assert not req.captured
    (window,) = prof.manifest.windows
    assert window.state == "failed" and "start refused for step 1" in (window.error or "")
