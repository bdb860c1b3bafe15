"""The local multi-node Ray cluster of ``examples/ray_cluster.py``, shared by a test module.

Needs Linux, root, util-linux and a working libfaketime (``pip install libfaketime``);
elsewhere these tests skip. The e2e folder's own conftest needs vLLM, so run this folder alone:
``python -m pytest --confcutdir e2e/cluster e2e/cluster``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs Ray")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import ray
from ray_cluster import LocalCluster, start_cluster, unmet_requirement

SKEWS_MS = [0.0, 2500.0, -1700.0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A three-node cluster (skews 0, +2.5 s, -1.7 s) with this process as its driver."""
    reason = unmet_requirement()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cluster")
    with start_cluster(root / "out", SKEWS_MS, root / "logs") as started:
        ray.init(address=started.address)
        try:
            yield started
        finally:
            ray.shutdown()
