"""A fragment inside the reader's run: ``cfg`` and its profiler ``prof``, open, in step 1."""
# ruff: noqa: F704 (top-level await: the docs' driver runs blocks as ``python -m asyncio`` does)

import contextlib
from pathlib import Path

import aprof

if not Path("profile.yaml").exists():
    Path("profile.yaml").write_text("global_profiler: {steps: [1], save_path: outputs/profile}")
cfg = aprof.load_config("profile.yaml")
# Left open: the profiler and its step last until the block's process ends.
run = contextlib.AsyncExitStack()
prof = await run.enter_async_context(aprof.Profiler(cfg))
await run.enter_async_context(prof.step(1))
