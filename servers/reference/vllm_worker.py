"""vLLM's worker-side profiler, era by era: the part that counts engine iterations.

Runs on the engine thread. Era A (<= 0.11) is a raw torch profiler: a second start restarts
it, a stop with nothing running fails. From 0.12 a wrapper guards it: a second start or a
stop with nothing running is ignored, and ``delay_iterations``/``max_iterations`` bound the
capture. As in vLLM, the step hook runs before each forward: with a delay of D the capture
starts in the D-th iteration after the start and records it (D - 1 iterations skipped), and
with a maximum of N it stops inside iteration N + 1, before that iteration's forward.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from aprof import AprofError
from servers.reference.engine import StepInfo

if TYPE_CHECKING:
    from servers.reference.capture import TorchCapture

logger = structlog.get_logger("servers.reference")


class ProfilerNotRunning(AprofError, RuntimeError):
    """A raw (era A) torch profiler was stopped without running: vLLM answers 500."""


@dataclass(frozen=True, slots=True)
class WorkerWindow:
    """What one start asks the worker for."""

    delay_iterations: int = 0
    max_iterations: int = 0
    prefix: str | None = None
    profiler_kwargs: dict[str, Any] | None = None


class VllmWorkerProfiler:
    """The worker profiler of one imitated vLLM version; every method runs on the engine thread."""

    def __init__(self, *, version: tuple[int, int, int], directory: Path, instance_id: str) -> None:
        self._version = version
        self._directory = directory
        self._instance_id = instance_id
        self._capture: TorchCapture | None = None
        self._window = WorkerWindow()
        self._active = False
        self._iterations = 0
        self._profiled = 0

    @property
    def _raw(self) -> bool:
        return self._version < (0, 12, 0)

    def start(self, window: WorkerWindow) -> None:
        """Handle a start request from the API server."""
        if self._raw:
            if self._capture is not None:
                # A raw torch profiler started twice begins anew; what it held is lost.
                self._capture.stop()
                self._capture = None
            self._window = window
            self._begin()
            return
        if self._active:
            logger.debug("vllm worker: start while active, ignored")
            return
        self._window = window
        self._active = True
        self._iterations = self._profiled = 0
        if window.delay_iterations == 0:
            self._begin()

    def stop(self) -> list[Path]:
        """Handle a stop request; returns the files written."""
        if self._raw:
            if self._capture is None:
                raise ProfilerNotRunning("the worker profiler is not running")
            return self._end()
        if not self._active:
            logger.debug("vllm worker: stop while not active, ignored")
            return []
        self._active = False
        return self._end() if self._capture is not None else []

    def step(self, info: StepInfo) -> None:
        """The per-iteration hook, before the forward: delayed start and auto-stop."""
        if self._raw or not self._active:
            return
        self._iterations += 1
        delay, limit = self._window.delay_iterations, self._window.max_iterations
        if self._capture is None and delay > 0 and self._iterations == delay:
            self._begin()
        if self._capture is None:
            return
        self._profiled += 1
        if limit > 0 and self._profiled > limit:
            files = self._end()
            logger.info(
                "vllm worker: auto-stop",
                step=info.number,
                recorded=limit,
                files=[str(f) for f in files],
            )
            if self._version >= (0, 29, 0):
                self._active = False
            # Before 0.29 the worker stays active: later starts are ignored until a stop.

    def shutdown(self) -> None:
        """Drop a running capture without writing it (server shutdown)."""
        if self._capture is not None:
            self._capture.stop()
            self._capture = None
        self._active = False

    def _begin(self) -> None:
        from servers.reference.capture import TorchCapture

        try:
            self._capture = TorchCapture(
                ["CPU"],
                metadata={
                    "vllm_version": ".".join(map(str, self._version)),
                    "vllm_version_tuple": list(self._version),
                },
                extra=self._window.profiler_kwargs,
            )
        except Exception as exc:
            # vLLM only logs a profiler that fails to start ("Failed to start profiler").
            logger.warning("vllm worker: failed to start profiler", error=str(exc))
            self._capture = None

    def _end(self) -> list[Path]:
        capture, self._capture = self._capture, None
        assert capture is not None
        name = self._worker_name()
        trace = capture.export(self._directory / f"{name}.{time.time_ns()}.pt.trace.json.gz")
        files = [trace]
        if self._version >= (0, 12, 0):
            summary = self._directory / f"{name}.profiler_out.txt"
            summary.write_text(capture.summary() + "\n")
            files.append(summary)
        return files

    def _worker_name(self) -> str:
        if self._raw:
            return f"{socket.gethostname()}_{os.getpid()}"
        if self._version < (0, 17, 0):
            return f"{self._instance_id}-rank-0"
        # Per-call prefixes exist over HTTP only from 0.32; CPU workers are named rank0.
        prefix = self._window.prefix
        return f"{prefix}_rank0" if prefix else "rank0"
