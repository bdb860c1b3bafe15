"""aprof on Ray: engine workers as Ray actors, and one profiler shared by many processes.

``worker_group`` and ``ProfilerMixin``: each engine rank's profiler inside its actor, driven
from the driver. ``share`` and ``connect``: agent loops in other processes gate, count and
record through the driver's profiler. ``placed``: a server's capture target driven on its
own node. ``collect``: a run's files brought home from the other nodes of its cluster.
``import aprof.ray`` works without Ray installed; the functions need it
(``pip install 'aprof[ray]'``).
"""

from aprof.ray._collect import Collection, collect
from aprof.ray._placed import PlacedTarget, placed
from aprof.ray._remote import RemoteProfiler, connect
from aprof.ray._share import ShareHandle, share
from aprof.ray._workers import ProfilerMixin, worker_group

__all__ = [
    "Collection",
    "PlacedTarget",
    "ProfilerMixin",
    "RemoteProfiler",
    "ShareHandle",
    "collect",
    "connect",
    "placed",
    "share",
    "worker_group",
]
