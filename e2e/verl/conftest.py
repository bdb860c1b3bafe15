"""What the verl tests share: skipped without verl (``nox -s verl`` installs 0.9.1 and what its
modules import on CPU), and a local Ray cluster per test module."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A local cluster whose actors can unpickle the test module's classes."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (nox -s verl installs it)")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local test cluster needs no token
    module = sys.modules[request.module.__name__]
    ray.cloudpickle.register_pickle_by_value(module)  # not importable in Ray's workers
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(module)
