"""One real ``torch.profiler`` capture and the files it leaves behind.

Every method runs on the engine thread: torch records the operators of the thread that
started the profiler, and that is the thread that runs the forward passes.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity

_ACTIVITIES = {"CPU": ProfilerActivity.CPU, "CUDA": ProfilerActivity.CUDA}


def available_activities(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that this machine can record (``CUDA`` needs a GPU)."""
    usable = {"CPU"} | ({"CUDA"} if torch.cuda.is_available() else set())
    return [name for name in dict.fromkeys(names) if name in usable]


class TorchCapture:
    """A started ``torch.profiler.profile`` session that is later exported or discarded."""

    def __init__(
        self,
        activities: Iterable[str],
        *,
        with_stack: bool = False,
        record_shapes: bool = False,
        metadata: Mapping[str, object] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """``extra``: more ``torch.profiler.profile`` keyword arguments (vLLM's profiler_kwargs)."""
        options: dict[str, Any] = {"with_stack": with_stack, "record_shapes": record_shapes}
        options.update(extra or {})
        self._profile = torch.profiler.profile(
            activities=[_ACTIVITIES[name] for name in activities], **options
        )
        self._profile.start()
        for key, value in (metadata or {}).items():
            self._profile.add_metadata_json(key, json.dumps(value))
        self._stopped = False

    def stop(self) -> None:
        """Stop recording (idempotent)."""
        if not self._stopped:
            self._stopped = True
            self._profile.stop()

    def export(self, path: Path) -> Path:
        """Stop, then write a gzip Chrome trace to ``path``; returns ``path``.

        The file appears complete or not at all: it is written under a hidden name in the
        same directory and renamed, so a reader polling the directory never sees half of it.
        """
        self.stop()
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = path.with_name(f".{path.name}.{os.getpid()}.json")
        packed = path.with_name(f".{path.name}.{os.getpid()}.gz")
        try:
            self._profile.export_chrome_trace(str(raw))
            with raw.open("rb") as source, gzip.open(packed, "wb", compresslevel=1) as target:
                shutil.copyfileobj(source, target)
            packed.replace(path)
        finally:
            raw.unlink(missing_ok=True)
            packed.unlink(missing_ok=True)
        return path

    def summary(self) -> str:
        """The key-averages table of the stopped capture (what vLLM writes next to a trace)."""
        self.stop()
        table: str = self._profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=50)
        return table
