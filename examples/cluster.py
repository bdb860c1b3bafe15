"""A profiled run over a Ray cluster whose nodes share no files and no clock, on one machine.

It starts a real Ray cluster (``ray_cluster.py``): a head, where this driver runs, and worker
nodes whose raylets run in mount namespaces of their own (a private file system over --out)
with their wall clocks shifted by --skew-ms (libfaketime). A reference server runs on each
worker node, its capture target placed there (``aprof.ray.placed``), and agent-loop actors on
every node. The profiler measures each host's clock as it goes and, as it closes, brings every
node's files into its save_path (``cluster.collect: on_close``); then each profiled step is
merged on the driver's clock. It prints each host's offset against the skew it was given and
the files each host wrote, and exits 1 when a file did not come home or a clock is off by more
than its uncertainty and 2 ms.

Needs Linux, root, ``unshare`` and libfaketime (Debian: ``apt-get install faketime``).

Run: python examples/cluster.py --out DIR --nodes 3 --skew-ms 0,2500,-1700 --steps 2 --num-steps 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import ray
import ray_agent_loops
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray_agent_loops import REFERENCE_VERSION, AgentLoopWorker, close_all
from ray_cluster import LocalCluster, Node, start_cluster

import aprof
import aprof.ray
from servers import launch, launch_spec
from servers.process import LaunchedServer, free_port

TOLERANCE_NS = 2_000_000
"""How far beyond its own uncertainty a measured offset may lie from the skew injected."""


class ServerHost:
    """A reference server on one node: launched there, so its traces are that node's."""

    def __init__(self) -> None:
        self._server: LaunchedServer | None = None

    async def start(self, spec: Any, log_path: str) -> str:
        self._server = await launch(spec, log_path=log_path)
        return str(spec.base_url)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.aclose()


def on(node: Node, actor: Any) -> Any:
    """``actor`` (a Ray remote class) pinned to ``node``, of no CPU."""
    there = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    return actor.options(num_cpus=0, scheduling_strategy=there)


def config_of(out: Path, steps: str, collect: str) -> aprof.ProfilerConfig:
    return aprof.load_config(
        {
            "global_profiler": {
                "steps": steps,
                "save_path": str((out / "profile").resolve()),
                "wait_for_stops": True,
            },
            # Started as the step begins: no request waits for a start (their spans stay short).
            "rollout": {"replicas": "all", "forward_steps": 4, "start": "on_step"},
            "timeouts": {"connect_s": 30},
            "cluster": {"collect": collect},
            "log": {"level": "warning"},
        }
    )


async def drive(
    cluster: LocalCluster, config: aprof.ProfilerConfig, num_steps: int, loops: int
) -> aprof.Manifest:
    """The run: servers on the worker nodes, agent loops on every node, the steps."""
    save_path = config.global_profiler.save_path
    servers = cluster.nodes[1:] or cluster.nodes
    async with contextlib.AsyncExitStack() as stack:
        specs, hosts = [], []
        for node in servers:
            spec = launch_spec("reference", config, version=REFERENCE_VERSION, port=free_port())
            host = on(node, ray.remote(ServerHost)).remote()
            # The node's own folder: the driver cannot see it, nor its log.
            await host.start.remote(spec, str(save_path.parent / "logs" / f"{node.ip}.log"))
            stack.push_async_callback(host.stop.remote)
            specs.append(spec)
            hosts.append(node)
        prof = aprof.Profiler(config)
        for r, (spec, node) in enumerate(zip(specs, hosts, strict=True)):
            prof.add_target(aprof.ray.placed(spec.adapter(replica=r), node.node_id))
        await stack.enter_async_context(prof)
        handle = aprof.ray.share(prof)
        urls = [spec.base_url for spec in specs]
        workers = [
            on(node, ray.remote(AgentLoopWorker)).remote(handle, k, urls)
            for k, node in enumerate(cluster.nodes)
        ]
        stack.push_async_callback(close_all, workers)
        await asyncio.gather(*(w.ready.remote() for w in workers))
        for n in range(1, num_steps + 1):
            async with prof.step(n):
                await asyncio.gather(*(w.rollout.remote(n, loops) for w in workers))
    return prof.manifest


def run(
    cluster: LocalCluster,
    out: Path,
    *,
    steps: str,
    num_steps: int,
    loops: int = 4,
    collect: str = "on_close",
) -> aprof.Manifest:
    """The profiled run on ``cluster`` (this process its driver, on the head, joined to the
    cluster with ``ray.init``), saved below ``out/profile``."""
    config = config_of(out, steps, collect)
    aprof.configure_logging(config.log.format, config.log.level)
    for module in (sys.modules[__name__], ray_agent_loops):
        ray.cloudpickle.register_pickle_by_value(module)  # not importable on the nodes
    return asyncio.run(drive(cluster, config, num_steps, loops))


def check(cluster: LocalCluster, manifest: aprof.Manifest) -> list[str]:
    """What is wrong with the run: a clock off, a file of another host not home."""
    wrong = []
    save_path = Path(manifest.save_path)
    head = cluster.nodes[0]
    hosts = {h.host: h for h in manifest.hosts}
    for node in cluster.nodes:
        found = hosts.get(node.ip)
        if found is None:
            wrong.append(f"host {node.ip}: no clock measured")
            continue
        expected = round((head.skew_ms - node.skew_ms) * 1e6)
        if abs(found.offset_ns - expected) > found.uncertainty_ns + TOLERANCE_NS:
            wrong.append(f"host {node.ip}: offset {found.offset_ns} ns, expected {expected} ns")
    for f in manifest.files:
        if f.host != head.ip and (f.sha256 is None or not (save_path / f.path).is_file()):
            wrong.append(f"{f.path} (host {f.host}) did not come home")
    wrong += [n.text for n in manifest.notes if n.level == "problem"]
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder of the run (save_path below)"
    )
    parser.add_argument("--nodes", type=int, default=3, help="Ray nodes, the head included")
    parser.add_argument("--skew-ms", default="0,2500,-1700", help="each node's clock shift")
    parser.add_argument("--steps", default="2", help="profiled steps (default 2)")
    parser.add_argument("--num-steps", type=int, default=3, help="steps to run (default 3)")
    parser.add_argument("--loops", type=int, default=4, help="agent loops per actor and step")
    args = parser.parse_args()
    skews = [float(s) for s in args.skew_ms.split(",")]
    if len(skews) != args.nodes:
        parser.error(f"--skew-ms names {len(skews)} nodes, --nodes says {args.nodes}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster needs no token
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with start_cluster(out, skews, out.parent / f"{out.name}-cluster-logs") as cluster:
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            manifest = run(
                cluster, out, steps=args.steps, num_steps=args.num_steps, loops=args.loops
            )
        finally:
            ray.shutdown()
        wrong = check(cluster, manifest)
    for h in manifest.hosts:
        print(f"host {h.host}: offset {h.offset_ns / 1e6:+.3f} ms ±{h.uncertainty_ns / 1e6:.3f}")
    by_host: dict[str, int] = {}
    for f in manifest.files:
        by_host[f.host] = by_host.get(f.host, 0) + 1
    print("files: " + ", ".join(f"{n} on {host}" for host, n in sorted(by_host.items())))
    for step in aprof.merge(manifest.save_path):
        print(f"step {step.step}: {step.path}")
    for line in wrong:
        print(f"wrong: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
