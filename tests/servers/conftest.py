"""Fixtures for server tests: reference servers on 127.0.0.1 and an HTTP session.

This folder has no ``__init__.py`` on purpose: with one, pytest would import it as the
package ``servers`` and shadow the real one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from faults.common import on_another_device
from structlog.testing import capture_logs

from servers.reference import ReferenceConfig, ReferenceServer, serve

__all__ = ["on_another_device"]  # for the tests of this folder

ReferenceFactory = Callable[..., contextlib.AbstractAsyncContextManager[ReferenceServer]]
Complete = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
def reference_server(tmp_path: Path) -> ReferenceFactory:
    """``async with reference_server(dialect="vllm", **cfg) as server``: a running server.

    Keyword arguments are ``ReferenceConfig`` fields. ``profiler_dir`` defaults to
    ``tmp_path/"traces"`` (also SGLang's default ``output_dir``, so nothing lands in the
    system temp directory).
    """

    @contextlib.asynccontextmanager
    async def start(**fields: Any) -> AsyncIterator[ReferenceServer]:
        fields.setdefault("profiler_dir", tmp_path / "traces")
        async with serve(ReferenceConfig(**fields)) as server:
            yield server

    return start


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session whose every request is bounded (30 s)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
def complete(http: aiohttp.ClientSession) -> Complete:
    """``await complete(server, max_tokens=4)``: one non-streamed completion, its JSON body."""

    async def run(server: ReferenceServer, max_tokens: int = 4, prompt: str = "hello") -> Any:
        body = {"model": server.cfg.model_name, "prompt": prompt, "max_tokens": max_tokens}
        async with http.post(f"{server.url}/v1/completions", json=body) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    return run


@pytest.fixture
def logs() -> Iterator[list[Any]]:
    """Every structlog event logged during the test, whatever level an earlier test set."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as captured:
            yield captured
    finally:
        structlog.configure(**before)
