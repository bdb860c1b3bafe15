"""An agent on every node of the Ray cluster: the node's clock and its part of the run's
files, asked by the driver (its clock probes, the collection of the run's files)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from aprof._core.host import node_address
from aprof._errors import describe
from aprof.ray._clocks import HostClocks, burst
from aprof.ray._run_files import Listing, digest_below, list_below, read_below

AGENT_S = 30.0
"""The longest one call to a node's agent may take at least: its first waits for the agent's
process to start on a busy node."""


class NodeAgent:
    """Runs on one node (a Ray actor of no CPU): answers for ``save_path`` there."""

    def __init__(self, save_path: str, run_id: str) -> None:
        self._root = save_path
        self._run_id = run_id

    def now_ns(self) -> int:
        """This node's wall clock."""
        return time.time_ns()

    def listing(self) -> Listing:
        """The run's files on this node (``shared`` when it sees the driver's)."""
        return list_below(self._root, self._run_id)

    def digest(self, path: str) -> tuple[int, str]:
        """The size and SHA-256 of the file ``path`` below ``save_path``."""
        return digest_below(self._root, path)

    def read(self, path: str, offset: int, size: int) -> bytes:
        """At most ``size`` bytes of the file ``path`` below ``save_path`` from ``offset``."""
        return read_below(self._root, path, offset, size)


@dataclass
class Node:
    """One other node of the cluster and its agent."""

    node_id: str
    host: str
    agent: Any


class Nodes:
    """An agent on each live node of the cluster but the driver's (blocking calls: run them
    off the event loop), each call bounded by ``call_s``."""

    def __init__(self, save_path: str, run_id: str, call_s: float) -> None:
        import ray

        self._ray = ray
        self._save_path = save_path
        self._run_id = run_id
        self.call_s = call_s
        self.driver_id = ray.get_runtime_context().get_node_id()
        self.driver = node_address(self.driver_id)
        self.nodes: dict[str, Node] = {}
        self.gone: dict[str, str] = {}
        """Hosts whose agent could not be reached, and why."""

    def refresh(self) -> None:
        """An agent on every live node not covered yet; nodes gone are dropped."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = {
            n["NodeID"]: str(n["NodeManagerAddress"])
            for n in self._ray.nodes()  # type: ignore[no-untyped-call]
            if n.get("Alive") and n["NodeID"] != self.driver_id
        }
        for node_id in set(self.nodes) - set(alive):
            node = self.nodes.pop(node_id)
            self.gone.setdefault(node.host, "its Ray node is gone")
        for node_id, host in alive.items():
            if node_id in self.nodes:
                continue
            there = NodeAffinitySchedulingStrategy(node_id, soft=False)
            agent = (
                self._ray.remote(NodeAgent)
                .options(num_cpus=0, scheduling_strategy=there)
                .remote(self._save_path, self._run_id)
            )
            self.nodes[node_id] = Node(node_id, host, agent)

    def call(self, node: Node, method: str, *args: Any, limit_s: float | None = None) -> Any:
        """``method(*args)`` of ``node``'s agent, waited for at most ``limit_s`` (by
        default ``call_s``)."""
        ref = getattr(node.agent, method).remote(*args)
        return self.wait(ref, self.call_s if limit_s is None else limit_s)

    def wait(self, ref: Any, limit_s: float) -> Any:
        """The value of the Ray object ``ref``, waited for at most ``limit_s``."""
        return self._ray.get(ref, timeout=limit_s)

    def measure(self, clocks: HostClocks) -> None:
        """A burst of clock probes of every node; one that does not answer is marked gone."""
        self.refresh()
        for node in list(self.nodes.values()):
            try:
                clocks.add(node.host, burst(partial(self._now, node)))
            except Exception as exc:
                self.gone[node.host] = describe(exc)
            else:
                self.gone.pop(node.host, None)  # it answers (again)

    def _now(self, node: Node) -> int:
        return int(self.call(node, "now_ns"))

    def close(self) -> None:
        """End every agent."""
        for node in self.nodes.values():
            try:
                self._ray.kill(node.agent)
            except Exception:  # a node gone takes its agent with it
                continue
        self.nodes.clear()
