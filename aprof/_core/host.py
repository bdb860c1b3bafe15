"""The name of the machine a process runs on, as the manifest writes it."""

from __future__ import annotations

import socket
import sys


def host_name() -> str:
    """In a process of a Ray cluster, its node as Ray names it (the node's IP address, which
    tells apart nodes that share a host name); elsewhere the host name."""
    ray = sys.modules.get("ray")  # never imported here: a process without Ray has no node
    if ray is not None:
        try:
            if ray.is_initialized():
                return node_address(ray.get_runtime_context().get_node_id())
        except Exception:  # a Ray that cannot answer: the host name is still true
            pass
    return socket.gethostname()


def node_address(node_id: str) -> str:
    """The address Ray gives the node ``node_id`` (a driver's own guess of its IP may name
    another interface than the node it joined)."""
    import ray

    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("NodeID") == node_id:
            return str(node["NodeManagerAddress"])
    raise LookupError(f"no Ray node {node_id}")
