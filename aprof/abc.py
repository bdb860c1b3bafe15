"""The protocols a user implements or receives: what aprof drives, and what agent loops use.

- :class:`CaptureTarget` (and :class:`ManagedTarget`): anything the profiler starts and stops
  one capture of at a time (servers, worker groups, your own);
- :class:`WorkerHandle`: the driver's handle on one rank of a worker group;
- :class:`CaptureTool`: one capture at a time inside a worker process (``aprof.tools``);
- :class:`RolloutProfiler`: what agent loops use of a profiler, in its own process or another.

The values exchanged with them (``Window``, ``CaptureResult``, ``WorkerCapture``,
``WorkerTimeline``) are frozen dataclasses, re-exported from ``aprof``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from aprof._capture import CaptureResult, TargetKind, Window, WorkerCapture, WorkerTimeline

if TYPE_CHECKING:
    from aprof._config import LimitsConfig, TimeoutsConfig
    from aprof._timeline.events import AttrValue
    from aprof._timeline.recorder import NullSpan, Request, Span

__all__ = ["CaptureTarget", "CaptureTool", "ManagedTarget", "RolloutProfiler", "WorkerHandle"]


@runtime_checkable
class CaptureTarget(Protocol):
    """Anything that can start and stop one capture at a time.

    Role targets may also carry ``role: str`` (defaults to ``name``) and ``rank: int``
    (the worker rank they capture; without it the target writes one ``rank_<k>`` folder
    per rank under the role folder itself), and ``tool: str`` (defaults to the
    configured ``global_profiler.tool``).
    """

    name: str
    """Unique and path-safe: ``replica_0``, ``actor``."""
    kind: TargetKind
    replica: int | None
    """The replica a rollout target serves; ``None`` for role targets."""
    enforces_window: bool
    """True when the target itself skips ``delay`` and stops after ``forward_steps``."""

    async def start(self, window: Window) -> None:
        """Start the capture of ``window``; raise on failure."""
        ...

    async def stop(self, window: Window) -> CaptureResult:
        """Stop the capture of ``window`` (a no-op for one the target ended itself)."""
        ...

    async def forward_steps(self) -> int | None:
        """The engine's forward-step counter, ``None`` if unknown."""
        ...


@runtime_checkable
class ManagedTarget(Protocol):
    """A capture target that holds resources (an HTTP session): opened before its first
    start, closed when the profiler closes."""

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig) -> None:
        """Acquire what the target needs, with the configured bounds on time and bytes."""
        ...

    async def aclose(self) -> None:
        """Release what :meth:`open` acquired."""
        ...


@runtime_checkable
class WorkerHandle(Protocol):
    """The driver's handle on one rank of a worker group."""

    rank: int

    async def begin(self, step: int) -> None:
        """Open the rank's capture window at global step ``step``; raise on failure."""
        ...

    async def end(self) -> list[WorkerCapture]:
        """Close the window :meth:`begin` opened (a continuous one too); its captures."""
        ...

    async def timeline(self) -> WorkerTimeline | None:
        """The rank's timeline as written so far, its latest stages included; ``None``
        when the rank records none."""
        ...


@runtime_checkable
class CaptureTool(Protocol):
    """One capture at a time inside a worker process (synchronous)."""

    name: str
    """The tool's name as in ``global_profiler.tool``."""
    note: str | None
    """Anything the manifest reader should know about the last capture (``None`` if nothing)."""

    def start(self, dir: Path, stem: str, *, scheduled: bool = False) -> None:
        """Begin a capture writing into ``dir``; every file name starts with ``stem``.

        ``scheduled``: follow the tool's mini-batch schedule, advanced by ``step`` (only
        passed, as True, to a tool whose config has one).
        """
        ...

    def stop(self) -> list[Path]:
        """End the capture; the files and folders it wrote."""
        ...

    def stage(self, name: str) -> AbstractContextManager[None]:
        """A named range (stage) inside the active capture."""
        ...

    def step(self) -> None:
        """The current mini-batch ended: advance a scheduled capture; else nothing."""
        ...


class RolloutProfiler(Protocol):
    """What agent loops use of a profiler: :class:`~aprof.Profiler` in its own process, and
    ``aprof.ray.connect(...)``'s remote profiler in any other."""

    @property
    def current_step(self) -> int | None:
        """The global step now open, if any."""

    def request(self, *, replica: int, request_id: str | None = None) -> Request:
        """The context of one request to ``replica``: gate, count, and report what happened."""

    def span(self, name: str, /, **attrs: AttrValue) -> Span | NullSpan:
        """A timeline span named ``name``, for ``with`` or ``async with``."""
