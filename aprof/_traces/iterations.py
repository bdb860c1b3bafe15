"""What an engine's trace calls one iteration (one forward step): the names of the per-step
``user_annotation`` ranges each server writes. Read by ``aprof report`` (iteration durations)
and by ``servers.trace_files`` (forward steps counted in a capture's traces).

Standard library only.
"""

from __future__ import annotations

import re
from typing import Literal

REFERENCE_STEP = "forward_step#"
"""The reference server's range around each forward step (``forward_step#<k>``); in its vLLM
dialect the vLLM annotation is nested inside it."""
VLLM_ITERATION = re.compile(r"execute_(\d+_)?context_\d+\(")
"""vLLM's per-engine-step annotation (``execute_context_1(2)_generation_0(0)``; with
``detailed_trace_annotation`` the scheduled token count comes first)."""
SGLANG_STEP = "step["
"""SGLang's per-forward-pass annotation (``step[EXTEND bs=1 toks=1]``, ``step[DECODE bs=1]``)."""

Dialect = Literal["reference", "vllm", "sglang"]


def iteration_dialect(name: str) -> Dialect | None:
    """Which engine's iteration range ``name`` is, or ``None`` when it is none."""
    if name.startswith(REFERENCE_STEP):
        return "reference"
    if VLLM_ITERATION.match(name):
        return "vllm"
    if name.startswith(SGLANG_STEP):
        return "sglang"
    return None
