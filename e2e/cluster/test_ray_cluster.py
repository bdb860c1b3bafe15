"""The local cluster harness: per-node clocks, per-node folders, node names, a node's death.

The tests share one module-scoped cluster and run in file order: the last two kill a node and
close the cluster.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import ray
from ray_cluster import LocalCluster, Node, live, on_node

TOLERANCE_MS = 50.0

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the nodes cannot import it


def offset_ms(node: Node, clock_ns: str) -> tuple[float, float]:
    """(node's clock - ours at the read's midpoint, half the read's window), both in ms.

    Of a few reads the one with the narrowest window: the offset is known within half of it.
    """
    clock = getattr(time, clock_ns)
    samples = []
    for _ in range(5):
        before = clock()
        remote = on_node(node, clock)
        after = clock()
        samples.append(((after - before) / 2e6, (remote - (before + after) / 2) / 1e6))
    half_window, offset = min(samples)
    return offset, half_window


def test_each_node_reads_its_own_wall_clock_and_the_shared_monotonic_clock(
    cluster: LocalCluster,
) -> None:
    for node in cluster.nodes:
        wall, wall_window = offset_ms(node, "time_ns")
        assert abs(wall - node.skew_ms) <= TOLERANCE_MS + wall_window, (node, wall)
        monotonic, monotonic_window = offset_ms(node, "monotonic_ns")
        assert abs(monotonic) <= TOLERANCE_MS + monotonic_window, (node, monotonic)


def subprocess_time_ns() -> int:
    """The wall clock as a child process of a Ray task reads it."""
    import subprocess

    command = [sys.executable, "-c", "import time; print(time.time_ns())"]
    return int(subprocess.run(command, capture_output=True, check=True, text=True).stdout)


def test_a_tasks_subprocess_reads_the_nodes_clock(cluster: LocalCluster) -> None:
    node = cluster.nodes[1]
    before = time.time_ns()
    child = on_node(node, subprocess_time_ns)
    after = time.time_ns()
    # The child's read lies between ours, shifted by the node's skew.
    assert before + node.skew_ms * 1e6 <= child + TOLERANCE_MS * 1e6
    assert child <= after + node.skew_ms * 1e6 + TOLERANCE_MS * 1e6


def test_each_worker_node_has_a_private_folder(cluster: LocalCluster) -> None:
    folder = cluster.folder
    head, one, two = cluster.nodes
    (folder / "driver.txt").write_text("driver")
    assert on_node(one, os.listdir, str(folder)) == []
    assert on_node(two, os.listdir, str(folder)) == []
    on_node(one, Path.write_text, folder / "one.txt", "one")
    on_node(two, Path.write_text, folder / "two.txt", "two")
    assert on_node(one, os.listdir, str(folder)) == ["one.txt"]
    assert on_node(two, os.listdir, str(folder)) == ["two.txt"]
    assert on_node(one, Path.read_text, folder / "one.txt") == "one"
    # The head shares the driver's file system.
    assert on_node(head, os.listdir, str(folder)) == ["driver.txt"]
    assert sorted(os.listdir(folder)) == ["driver.txt"]


def test_ray_names_three_alive_nodes_by_their_addresses(cluster: LocalCluster) -> None:
    alive = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    assert alive == {node.node_id: node.ip for node in cluster.nodes}
    assert len(set(alive.values())) == 3
    for node in cluster.nodes:
        assert on_node(node, ray.util.get_node_ip_address) == node.ip


def test_a_killed_node_dies_in_ray_and_the_others_work_on(cluster: LocalCluster) -> None:
    node = cluster.nodes[2]
    worker = on_node(node, os.getpid)
    pids = node.pids()
    assert worker in pids
    node.kill()
    assert not node.alive
    assert live(pids) == []
    deadline = time.monotonic() + 60
    while node_alive_in_ray(node):
        assert time.monotonic() < deadline, "node 2 still alive in ray.nodes() after 60 s"
        time.sleep(0.5)
    for other in cluster.nodes[:2]:
        assert on_node(other, ray.util.get_node_ip_address) == other.ip


def node_alive_in_ray(node: Node) -> bool:
    return any(entry["Alive"] for entry in ray.nodes() if entry["NodeID"] == node.node_id)


def test_close_leaves_no_raylet_or_gcs(cluster: LocalCluster) -> None:
    pids = [pid for node in cluster.nodes for pid in node.pids()]
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in live(pids)}
    ray_daemons = [pid for pid, name in names.items() if name in ("raylet", "gcs_server")]
    assert sorted(names[pid] for pid in ray_daemons) == ["gcs_server", "raylet", "raylet"]
    ray.shutdown()
    cluster.close()
    assert live(pids) == []
    assert not any(node.alive for node in cluster.nodes)
