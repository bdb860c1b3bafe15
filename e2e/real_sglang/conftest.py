"""Fixtures of the real-SGLang end-to-end tests: the tiny model and the server's environment.

The tests need SGLang 0.5.23 installed the CPU way (``nox -s e2e_sglang`` does it, see
``e2e/sglang_env``); elsewhere their module skips. Run them with ``--confcutdir
e2e/real_sglang``: the vLLM tests' conftest one folder up refuses to load without vLLM.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servers.tiny_llama import build_tiny_llama

STUBS = Path(__file__).resolve().parent.parent / "sglang_stubs"
"""Holds the import-only ``vllm._custom_ops`` SGLang's CPU rotary embedding imports."""


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama, built once per session (no download)."""
    return build_tiny_llama(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture(scope="session")
def owned_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The server's environment on top of the test's: its caches and temp files in test-owned
    folders, the ``vllm`` stub on its path, and the torch-native CPU path of SGLang."""
    root = tmp_path_factory.mktemp("sglang-home")
    folders = {"HOME": root / "home", "TMPDIR": root / "tmp"}
    for folder in folders.values():
        folder.mkdir()
    return {
        **{key: str(value) for key, value in folders.items()},
        "PYTHONPATH": str(STUBS),
        # "1" needs sgl_kernel's CPU build, which is not installed; "0" is the same as unset.
        "SGLANG_USE_CPU_ENGINE": "0",
    }
