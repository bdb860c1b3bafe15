"""Fixtures of the real-vLLM end-to-end tests: the tiny model and test-owned folders.

These tests need the CPU build of vLLM (``nox -s e2e_vllm`` installs it); elsewhere they skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM: run `nox -s e2e_vllm`")

from servers.tiny_llama import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama, built once per session."""
    return build_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def owned_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment that keeps vLLM's caches, sockets and temp files in test-owned folders."""
    root = tmp_path_factory.mktemp("vllm-home")
    env = {"HOME": root / "home", "TMPDIR": root / "tmp", "VLLM_CACHE_ROOT": root / "cache"}
    for folder in env.values():
        folder.mkdir()
    # KV cache size in GiB: the default takes a large share of the machine's memory.
    return {"VLLM_CPU_KVCACHE_SPACE": "1", **{k: str(v) for k, v in env.items()}}
