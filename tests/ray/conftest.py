"""A local Ray cluster per test module (starting one takes seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A local cluster whose actors can unpickle the test module's classes."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")
    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local test cluster needs no token
    module = sys.modules[request.module.__name__]
    ray.cloudpickle.register_pickle_by_value(module)  # not importable in Ray's workers
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(module)
        if previous is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous
