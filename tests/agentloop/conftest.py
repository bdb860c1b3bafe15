"""Fixtures of the agentloop tests: reference-server replicas on 127.0.0.1.

No ``__init__.py`` here on purpose: with one, pytest would import this folder as a package and
shadow the real ``agentloop``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agentloop_replicas import Replica, ReplicaFactory, serve_replica


@pytest.fixture
def replicas(tmp_path: Path) -> ReplicaFactory:
    """``async with replicas(2, dialect="sglang", **cfg) as [a, b]:`` running replicas.

    Keyword arguments are ``ReferenceConfig`` fields; ``profiler_dir`` defaults to a folder
    under ``tmp_path``.
    """

    @contextlib.asynccontextmanager
    async def start(n: int = 1, **fields: Any) -> AsyncIterator[list[Replica]]:
        fields.setdefault("profiler_dir", tmp_path / "traces")
        async with contextlib.AsyncExitStack() as stack:
            yield [await stack.enter_async_context(serve_replica(**fields)) for _ in range(n)]

    return start
