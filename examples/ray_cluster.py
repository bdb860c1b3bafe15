"""A real multi-node Ray cluster on one Linux machine, as if its nodes were separate hosts.

Node 0, the head, is where the driver runs: it sees the host's files. Every other node runs in
its own mount namespace with a private, empty tmpfs over ``folder``: what its processes write
there stays on that node, and neither the driver nor another node sees it, as on hosts without
a shared file system. Each node's wall clock is shifted by its skew: libfaketime is preloaded
into the node's ``ray start``, so the raylet and every process it starts (workers, actors,
their subprocesses) read ``time.time()`` shifted; monotonic clocks are left alone. The driver
keeps the real clock even when the head is skewed.

Nodes have distinct loopback addresses, the names Ray gives them: node k is ``127.0.0.{k+2}``
(Ray replaces ``127.0.0.1`` with the host's outward address, so no node can have it).

Needs Linux, root (for the mount namespaces), util-linux (``unshare``, ``setpriv``) and a
libfaketime that leaves Python 3.11's ``time.sleep`` working under ``FAKETIME_DONT_FAKE_MONOTONIC``:
the one the PyPI package ``libfaketime`` bundles does (it shifts clock reads only, not file
times); libfaketime before 0.9.11, e.g. Debian 12's, fails it (libfaketime issue #426), so
point ``LIBFAKETIME`` only at a newer one. ``unmet_requirement()`` tries the library.

Cleanup: ``close()`` (or leaving the ``with`` block) kills every process of every node; an
``atexit`` hook does it if the caller exits first. If the caller is killed outright, each
node's ``ray start`` gets SIGTERM (its parent-death signal) and stops its node; for that, start
the cluster from a thread that outlives it (the main thread). Every process of a node carries
``LOCAL_RAY_CLUSTER=<token>-<index>`` in its environment: stragglers can be found by it.

    with start_cluster(out, skews_ms=[0, 2500, -1700], log_dir=logs) as cluster:
        ray.init(address=cluster.address)
        on_node(cluster.nodes[1], os.listdir, str(out))  # []: node 1's own, empty folder
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

T = TypeVar("T")

MARKER = "LOCAL_RAY_CLUSTER"
"""Environment variable that every process of a node inherits: ``<cluster token>-<index>``."""
POLL_S = 0.2

# A killed node shows as dead in ray.nodes() after about period x threshold, not Ray's 15 s.
_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
_RAY_ENV = {
    # Recent Ray turns token authentication on for `ray start --head`; the driver has no token.
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}
# Every port explicit: nodes that start together would otherwise pick the same ones.
_NODE_PORTS = (
    "node-manager",
    "object-manager",
    "metrics-export",
    "dashboard-agent-listen",
    "dashboard-agent-grpc",
    "runtime-env-agent",
)
_HEAD_PORTS = 3  # the GCS's, the dashboard's, the Ray client server's


def unmet_requirement() -> str | None:
    """Why a local cluster cannot start here, or None when it can."""
    if sys.platform != "linux":
        return "needs Linux (mount namespaces)"
    if os.geteuid() != 0:
        return "needs root (mount namespaces)"
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (util-linux)"
    probe = ["unshare", "-m", "--propagation", "private", "true"]
    if subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode != 0:
        return "cannot make a mount namespace here (`unshare -m` refused: no CAP_SYS_ADMIN?)"
    library = _libfaketime()
    if library is None:
        return "needs libfaketime: `pip install libfaketime` (it bundles one) or LIBFAKETIME=<file>"
    return _faketime_fault(library)


def _libfaketime() -> Path | None:
    """The preload library: $LIBFAKETIME, else the one the PyPI package ``libfaketime`` bundles."""
    if "LIBFAKETIME" in os.environ:
        library = Path(os.environ["LIBFAKETIME"])
        return library if library.is_file() else None
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or not spec.submodule_search_locations:
        return None
    library = Path(spec.submodule_search_locations[0], "vendor/libfaketime/src/libfaketime.so.1")
    return library if library.is_file() else None


def _faketime_fault(library: Path) -> str | None:
    """What is wrong with shifting a Python process's clock by this library, or None."""
    probe = "import time; t = time.time_ns(); time.sleep(0.01); print(t)"
    env = {**os.environ, **_clock_env(library, 1000.0)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return f"{library}: a Python process under it hung in time.sleep"
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"{library}: a Python process under it failed ({last[0]}); see libfaketime #426"
    shift_s = (int(done.stdout) - time.time_ns()) / 1e9
    if not 0.0 < shift_s <= 1.0:  # +1 s less the probe's own run time
        return f"{library}: FAKETIME=+1 shifted the clock by {shift_s:.3f} s"
    return None


def _clock_env(library: Path, skew_ms: float) -> dict[str, str]:
    """Environment that shifts the wall clock of a process and its children by ``skew_ms``."""
    preload = os.environ.get("LD_PRELOAD")
    return {
        "LD_PRELOAD": f"{library}:{preload}" if preload else str(library),
        "FAKETIME": f"{skew_ms / 1000:+.3f}",  # seconds from the real clock
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # The raylet drops LD_PRELOAD from its workers' environment unless told to keep it.
        "RAY_LD_PRELOAD_ON_WORKERS": "1",
    }


@dataclass
class Node:
    """One Ray node of a local cluster."""

    index: int
    ip: str
    skew_ms: float
    log_path: Path
    """The output of the node's ``ray start``."""
    temp_dir: Path
    """The node's Ray temporary folder (sockets, session logs): short, as socket paths must be."""
    marker: str
    """The value of ``MARKER`` in the environment of every process of this node."""
    process: subprocess.Popen[bytes] = field(repr=False)
    node_id: str = ""
    """Ray's hex id of the node, set once it has registered."""
    killed: bool = False

    @property
    def alive(self) -> bool:
        """Whether the node runs: it was not killed and its ``ray start`` has not exited."""
        return not self.killed and self.process.poll() is None

    @property
    def ray_logs(self) -> Path:
        """Ray's logs of this node (raylet, workers; the head's also GCS and drivers)."""
        return self.temp_dir / "session_latest" / "logs"

    def pids(self) -> list[int]:
        """The live processes of this node."""
        return _pids_with(self.marker)

    def kill(self, timeout_s: float = 30.0) -> None:
        """Kill all processes of the node at once, as a host crash would; wait till all are gone."""
        self.killed = True
        deadline = time.monotonic() + timeout_s
        # A process may start another between the scan and the kill: scan until none is left.
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {self.index} ({self.ip}): pids {pids} outlived SIGKILL")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(POLL_S)
        self.process.wait(timeout=max(deadline - time.monotonic(), 1.0))


def _pids_with(marker: str) -> list[int]:
    """Live processes whose environment holds ``MARKER=marker`` (a zombie's is empty)."""
    needle = f"\0{MARKER}={marker}\0".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:  # gone meanwhile
            continue
        if needle in b"\0" + environ:
            pids.append(int(entry.name))
    return pids


def live(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie does not)."""
    running = []
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                running.append(pid)
    return running


class LocalCluster:
    """A started local cluster: its nodes (``nodes[0]`` the head) and its address."""

    def __init__(self, folder: Path, log_dir: Path) -> None:
        self.folder = folder
        self.log_dir = log_dir
        self.token = uuid.uuid4().hex[:12]
        self.temp_root = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
        """Holds each node's Ray temporary folder; removed on close."""
        self.nodes: list[Node] = []
        self.closed = False
        self.address = ""
        """``host:port`` of the head's GCS, for ``ray.init(address=...)`` and ``--address``."""
        atexit.register(self.close)

    @property
    def head(self) -> Node:
        """Node 0, where the driver runs."""
        return self.nodes[0]

    def close(self) -> None:
        """Kill every node (the head last); keep Ray's logs of node k under log_dir/ray/node<k>.

        A driver calls ``ray.shutdown()`` first: its Ray client keeps retrying a vanished GCS.
        """
        atexit.unregister(self.close)
        if self.closed:
            return
        self.closed = True
        stuck = []
        for node in reversed(self.nodes):
            try:
                node.kill()
            except TimeoutError as error:  # still kill the others
                stuck.append(error)
        for node in self.nodes:
            if node.ray_logs.is_dir():
                target = self.log_dir / "ray" / f"node{node.index}"
                shutil.copytree(node.ray_logs, target, dirs_exist_ok=True)
        shutil.rmtree(self.temp_root, ignore_errors=True)
        if stuck:
            raise stuck[0]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def start_cluster(
    folder: Path,
    skews_ms: list[float],
    log_dir: Path,
    num_cpus: int = 1,
    *,
    object_store_mb: int = 256,
    timeout_s: float = 120.0,
) -> LocalCluster:
    """Start one node per skew (the first is the head); return once all have registered."""
    reason = unmet_requirement()
    if reason is not None:
        raise RuntimeError(f"local Ray cluster: {reason}")
    library = _libfaketime()
    assert library is not None  # unmet_requirement found it
    folder.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(folder.resolve(), log_dir)
    try:
        if cluster.temp_root.is_relative_to(cluster.folder):
            raise RuntimeError(f"local Ray cluster: {folder} would hide {cluster.temp_root}")
        ports = iter(_free_ports(_HEAD_PORTS + len(skews_ms) * len(_NODE_PORTS)))
        cluster.address = f"{_ip(0)}:{next(ports)}"
        for index, skew_ms in enumerate(skews_ms):
            args = [
                f"--node-ip-address={_ip(index)}",
                f"--temp-dir={cluster.temp_root / f'node{index}'}",
                f"--num-cpus={num_cpus}",
                f"--object-store-memory={object_store_mb * 2**20}",
                "--disable-usage-stats",
                "--block",
                *(f"--{name}-port={next(ports)}" for name in _NODE_PORTS),
            ]
            if index == 0:
                args += _head_args(cluster.address, ports)
            else:
                args += [f"--address={cluster.address}"]
            cluster.nodes.append(_start_node(cluster, index, skew_ms, library, args))
        _await_registration(cluster, timeout_s)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _ip(index: int) -> str:
    return f"127.0.0.{index + 2}"


def _free_ports(count: int) -> list[int]:
    """Distinct ports free on every address now (held together, so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _head_args(address: str, ports: Iterator[int]) -> list[str]:
    """The head's own arguments of ``ray start``; ``ports`` yields free ports."""
    args = [
        "--head",
        f"--port={address.rsplit(':', 1)[1]}",
        f"--system-config={json.dumps(_SYSTEM_CONFIG)}",
        "--include-dashboard=false",
        f"--dashboard-port={next(ports)}",
    ]
    if importlib.util.find_spec("grpc") is not None:  # else Ray runs no client server
        args.append(f"--ray-client-server-port={next(ports)}")
    return args


def _start_node(
    cluster: LocalCluster, index: int, skew_ms: float, library: Path, args: list[str]
) -> Node:
    """Launch one node's ``ray start``: a worker node in a mount namespace of its own."""
    marker = f"{cluster.token}-{index}"
    env = {**os.environ, **_RAY_ENV, MARKER: marker}
    if skew_ms:
        env.update(_clock_env(library, skew_ms))
    ray_cli = Path(sys.executable).with_name("ray")
    # `ray start --block` stops its node on SIGTERM: sent if the caller dies without close().
    command = ["setpriv", "--pdeathsig", "TERM", "--", str(ray_cli), "start", *args]
    if index > 0:
        mount = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
        unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
        command = [*unshare, str(cluster.folder), *command]
    log_path = cluster.log_dir / f"node{index}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    temp_dir = cluster.temp_root / f"node{index}"
    return Node(index, _ip(index), skew_ms, log_path, temp_dir, marker, process)


def _await_registration(cluster: LocalCluster, timeout_s: float) -> None:
    """Poll the GCS until every node is alive in it; set each node's id."""
    # What `ray status` reads the node table with: ray.nodes() would need ray.init here.
    from ray._raylet import GcsClient  # type: ignore[attr-defined]
    from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[attr-defined]

    deadline = time.monotonic() + timeout_s
    gcs: Any = None
    pending = list(cluster.nodes)
    while pending:
        for node in pending:
            if node.process.poll() is not None:
                raise RuntimeError(
                    f"node {node.index} ({node.ip}): `ray start` exited with "
                    f"{node.process.returncode}; see {node.log_path} and {node.ray_logs}"
                )
        if time.monotonic() > deadline:
            late = ", ".join(f"node {n.index} ({n.ip}; see {n.log_path})" for n in pending)
            raise TimeoutError(f"not registered within {timeout_s} s: {late}")
        table = {}
        if gcs is None and _accepts(cluster.address):  # GcsClient() blocks 30 s on a closed port
            gcs = GcsClient(address=cluster.address)
        if gcs is not None:
            table = gcs.get_all_node_info(timeout=5)
        alive = {
            info.node_manager_address: node_id.hex()
            for node_id, info in table.items()
            if info.state == GcsNodeInfo.ALIVE
        }
        for node in pending:
            node.node_id = alive.get(node.ip, "")
        pending = [node for node in pending if not node.node_id]
        if pending:
            time.sleep(POLL_S)


def _accepts(address: str) -> bool:
    """Whether something listens at ``host:port``."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


@ray.remote(num_cpus=0, max_retries=0)
def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    return fn(*args)


def on_node(node: Node, fn: Callable[..., T], *args: Any, timeout_s: float = 60.0) -> T:
    """``fn(*args)``, run in a Ray task on ``node`` (the caller has called ``ray.init``).

    Ray's workers import ``fn``'s module by name: a function of a module they cannot import
    (a test module, say) needs ``ray.cloudpickle.register_pickle_by_value(module)`` first.
    """
    strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    result: T = ray.get(
        _call.options(scheduling_strategy=strategy).remote(fn, args), timeout=timeout_s
    )
    return result
