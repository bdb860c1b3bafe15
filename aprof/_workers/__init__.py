"""Engine workers: the profiler inside each rank and the driver's target over a role's ranks.

- ``profiler.py``: :class:`WorkerProfiler`, a rank's captures per step or per stage;
- ``group.py``: :class:`WorkerGroup`, the driver's capture target over a role's workers, and
  :class:`LocalWorker`, a worker in the driver's own process.
"""

from aprof._workers.group import LocalWorker, WorkerGroup
from aprof._workers.profiler import CAPTURES_FILE, WorkerProfiler, staged

__all__ = ["CAPTURES_FILE", "LocalWorker", "WorkerGroup", "WorkerProfiler", "staged"]
