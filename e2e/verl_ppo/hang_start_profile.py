"""A vLLM replica that never answers its profiling route: loaded in every process of a verl
run (``VERL_USE_EXTERNAL_MODULES``), it makes vLLM's ``AsyncLLM.start_profile``, which the
``/start_profile`` route awaits, wait forever. Only the fault tests load it."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

from aprof.verl.hook import after_import


def _hang(module: ModuleType) -> None:
    async def start_profile(self: Any, *args: Any, **kwargs: Any) -> None:
        await asyncio.Event().wait()

    module.AsyncLLM.start_profile = start_profile


after_import("vllm.v1.engine.async_llm", _hang)
