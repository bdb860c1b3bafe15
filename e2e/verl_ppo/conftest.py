"""verl 0.9.1's real ``main_ppo`` with aprof on, run by ``examples/verl_ppo.py`` (see
``verl_runs.py``): each run once per module, its folder shared by the module's tests.

These tests need verl 0.9.1, TransferQueue 0.1.11 and vLLM (``nox -s verl_e2e`` installs
them, vLLM's CPU build); elsewhere they skip. A run takes one to three minutes on two cores.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="needs verl 0.9.1: run `nox -s verl_e2e`")
pytest.importorskip("transfer_queue", reason="needs TransferQueue: run `nox -s verl_e2e`")
pytest.importorskip("vllm", reason="needs vLLM: run `nox -s verl_e2e`")
