"""SGLang's scheduler-side profiler (as of 0.5.23): ``num_steps``, absolute ``start_step``,
``profile_by_stage``. Runs on the engine thread.

``forward_ct`` counts every forward batch since launch and is raised before the batch's
forward, where the profiler's batch predicate runs:
- plain start: the capture starts now; with ``num_steps`` N it stops inside batch
  ``forward_ct + N + 1``, before that batch's forward, so exactly N batches are recorded;
- ``start_step`` S: the capture starts in batch ``max(S, forward_ct + 1)`` and stops in
  batch start + N (N batches, the start batch included);
- ``profile_by_stage``: prefill (EXTEND) and decode batches are captured into separate
  traces, up to N of each; the first decode batch flushes the prefill trace;
- a plain start while a capture runs answers success and restarts the capture: its steps
  so far are lost, the first start's output dir, id and stop target are kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from servers.reference.engine import StepInfo

if TYPE_CHECKING:
    from servers.reference.capture import TorchCapture

logger = structlog.get_logger("servers.reference")

IN_PROGRESS = "Profiling is already in progress. Call /stop_profile first."
NOT_IN_PROGRESS = "Profiling is not in progress. Call /start_profile first."
_ACTIVITY_NAMES = {"CPU": "CPU", "GPU": "CUDA"}


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """One start request, defaults already resolved."""

    output_dir: Path
    profile_id: str
    prefix: str | None
    activities: tuple[str, ...]
    with_stack: bool
    record_shapes: bool
    num_steps: int | None
    start_step: int | None
    by_stage: bool


class SglangSchedulerProfiler:
    """The profiler state of one SGLang scheduler (TP rank 0)."""

    def __init__(self) -> None:
        self._request: ProfileRequest | None = None
        self._capture: TorchCapture | None = None
        self._in_progress = False
        self._start_ct: int | None = None
        self._target_ct: int | None = None
        self._stage_counts = {"EXTEND": 0, "DECODE": 0}
        self._stage: str | None = None
        self.forward_ct = 0
        """Forward batches run since launch."""

    def start(self, request: ProfileRequest) -> str | None:
        """Handle a start; returns the failure message, or None on success."""
        if request.start_step is not None or request.by_stage:
            if self._in_progress:
                return IN_PROGRESS
            self._init(request)
            if not request.by_stage:
                assert request.start_step is not None
                self._start_ct = max(request.start_step, self.forward_ct + 1)
                if request.num_steps is not None:
                    self._target_ct = self._start_ct + request.num_steps
            return None
        if self._in_progress and self._capture is not None:
            # A plain start ignores the "already in progress" answer: a new profiler
            # replaces the running one, whose steps are lost, while the first call's
            # output dir, id and stop target stay (observed on SGLang 0.5.23).
            self._capture.stop()
            self._capture = None
            self._in_progress = False
            self._begin(stage=self._stage)
            return None
        self._init(request)
        if request.num_steps is not None:
            self._target_ct = self.forward_ct + request.num_steps + 1
        self._begin(stage=None)
        return None

    def stop(self) -> tuple[str | None, list[Path]]:
        """Handle a stop; returns (failure message or None, files written)."""
        if not self._in_progress:
            return NOT_IN_PROGRESS, []
        files = self._end()
        self._request = None  # a stopped capture does not resume at a later stage
        return None, files

    def step(self, info: StepInfo) -> None:
        """The batch predicate, run inside each batch before its forward."""
        self.forward_ct = info.number
        request = self._request
        if request is None:
            return
        if request.by_stage:
            self._stage_step("EXTEND" if info.kind == "prefill" else "DECODE", request)
            return
        if self._target_ct is not None and self._target_ct <= self.forward_ct:
            if self._in_progress:
                files = self._end()
                logger.info(
                    "sglang: auto-stop", forward_ct=self.forward_ct, files=[str(f) for f in files]
                )
            self._target_ct = None
        if self._start_ct is not None and self._start_ct == self.forward_ct:
            self._start_ct = None
            self._begin(stage=None)

    def shutdown(self) -> None:
        """Drop a running capture without writing it (server shutdown)."""
        if self._capture is not None:
            self._capture.stop()
            self._capture = None
        self._in_progress = False
        self._request = None

    def _init(self, request: ProfileRequest) -> None:
        self._request = request
        self._start_ct = self._target_ct = None
        self._stage_counts = {"EXTEND": 0, "DECODE": 0}

    def _stage_step(self, stage: str, request: ProfileRequest) -> None:
        if self._stage_counts[stage] == 0:
            if self._in_progress:
                self._end()  # the first decode batch flushes the prefill trace
            self._begin(stage=stage)
        self._stage_counts[stage] += 1
        limit = request.num_steps
        if limit is not None and self._stage_counts[stage] > limit and self._in_progress:
            self._end()

    def _begin(self, stage: str | None) -> None:
        from servers.reference.capture import TorchCapture, available_activities

        request = self._request
        assert request is not None
        activities = available_activities(
            _ACTIVITY_NAMES[name] for name in request.activities if name in _ACTIVITY_NAMES
        )
        if not activities:
            # No recognised activity: SGLang reports success but records nothing.
            logger.warning("sglang: no usable profiler activity", activities=request.activities)
            return
        self._capture = TorchCapture(
            activities, with_stack=request.with_stack, record_shapes=request.record_shapes
        )
        self._stage = stage
        self._in_progress = True

    def _end(self) -> list[Path]:
        request = self._request
        assert request is not None and self._capture is not None
        capture, self._capture = self._capture, None
        self._in_progress = False
        name = f"{request.profile_id}-TP-0"
        if request.prefix:
            name = f"{request.prefix}-{name}"
        if self._stage:
            name = f"{name}-{self._stage}"
        # Like SGLang, "~" is expanded where the trace is written, in the scheduler.
        path: Path = capture.export(request.output_dir.expanduser() / f"{name}.trace.json.gz")
        return [path]


def default_profile_id() -> str:
    """SGLang's default ``profile_id``: the start time as a float string."""
    return str(time.time())
