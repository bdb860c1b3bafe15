"""The profiler for synchronous training loops: the async ``Profiler`` on a thread of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Literal

from anyio.from_thread import BlockingPortal, start_blocking_portal

from aprof._accounting import STAGE, StepAccount
from aprof._config import ConfigSource, ProfilerConfig
from aprof._control import CaptureAnswer
from aprof._core.profiler import Profiler
from aprof._errors import UsageError
from aprof._manifest import Manifest
from aprof._timeline.events import AttrValue
from aprof.abc import CaptureTarget


class BlockingProfiler:
    """:class:`aprof.Profiler` for synchronous code: ``with aprof.BlockingProfiler(cfg) as
    prof:`` and ``with prof.step(n):`` around each global step.

    The async profiler runs in an event loop of its own, on its own thread (anyio's blocking
    portal): its captures, stops and timeouts go on between the caller's calls, and the
    caller may run event loops of its own (``asyncio.run``) between steps and inside them.
    Agent loops in other Ray processes join it through ``aprof.ray.share(prof)``.
    """

    def __init__(self, config: ConfigSource = None) -> None:
        self._profiler = Profiler(config)
        self._portal: BlockingPortal | None = None
        self._exit_portal: contextlib.ExitStack | None = None
        self._status: Literal["new", "open", "closed"] = "new"
        self._final: Manifest | None = None

    @property
    def config(self) -> ProfilerConfig:
        """The resolved configuration."""
        return self._profiler.config

    @property
    def save_path(self) -> Path:
        """The absolute folder everything of this run is written into."""
        return self._profiler.save_path

    @property
    def current_step(self) -> int | None:
        """The global step now open, if any."""
        return self._profiler.current_step

    @property
    def otel_endpoint(self) -> str | None:
        """The run's OTLP/HTTP receiver, as :attr:`aprof.Profiler.otel_endpoint`."""
        return self._profiler.otel_endpoint

    @property
    def manifest(self) -> Manifest:
        """The run's manifest: a copy as of now while the profiler is open, the final one
        after it closed."""
        if self._portal is None or self._status != "open":
            return self._final or self._profiler.manifest
        live = self._profiler.manifest
        return self._portal.call(lambda: live.model_copy(deep=True))

    def accounting(self, step: int | None = None) -> StepAccount | None:
        """Where step ``step`` (default: the latest that ended) went, as
        :meth:`aprof.Profiler.accounting`."""
        if self._portal is None or self._status != "open":
            return self._profiler.accounting(step)
        return self._portal.call(self._profiler.accounting, step)

    def add_target(self, target: CaptureTarget) -> None:
        """Register a capture target, before the profiler opens or while it is open."""
        if self._portal is None or self._status != "open":
            self._profiler.add_target(target)
        else:
            self._portal.call(self._profiler.add_target, target)

    def remove_target(self, name: str) -> None:
        """Unregister the capture target ``name``, as :meth:`aprof.Profiler.remove_target`."""
        if self._portal is None or self._status != "open":
            self._profiler.remove_target(name)
        else:
            self._portal.call(self._profiler.remove_target, name)

    def rollout_ended(self) -> None:
        """The open step's rollout is over, as :meth:`aprof.Profiler.rollout_ended`; returns
        once the role captures held for it have started (:meth:`aprof.Profiler.roles_started`),
        so that the stage the caller runs next is captured."""
        if self._portal is None or self._status != "open":
            self._profiler.rollout_ended()
        else:
            self._portal.call(self._profiler.rollout_ended)
            self._portal.call(self._profiler.roles_started)

    def step(self, n: int) -> AbstractContextManager[int]:
        """``with prof.step(n):`` global step ``n``: opens and closes that step's windows."""
        return self._open_portal().wrap_async_context_manager(self._profiler.step(n))

    def capture(
        self,
        next: int | None = None,
        steps: str | Sequence[int] | None = None,
        *,
        replicas: Sequence[int] | None = None,
        roles: Sequence[str] | None = None,
        forward_steps: int | None = None,
    ) -> CaptureAnswer:
        """Capture the next ``next`` global steps (default 1), or the listed ``steps``: see
        :meth:`aprof.Profiler.capture`."""

        def capture() -> CaptureAnswer:
            return self._profiler.capture(
                next, steps, replicas=replicas, roles=roles, forward_steps=forward_steps
            )

        if self._portal is None or self._status != "open":
            return capture()
        return self._portal.call(capture)

    def span(self, name: str, /, **attrs: AttrValue) -> AbstractContextManager[None]:
        """``with prof.span(name, **attrs):`` a timeline span of the caller's code."""
        return self._span(name, attrs)

    def stage(self, name: str, /, **attrs: AttrValue) -> AbstractContextManager[None]:
        """``with prof.stage(name):`` a trainer stage on the timeline, as
        :meth:`aprof.Profiler.stage`."""
        return self._span(name, {**attrs, "aprof": STAGE})

    @contextlib.contextmanager
    def _span(self, name: str, attrs: dict[str, AttrValue]) -> Generator[None]:
        portal = self._open_portal()
        # Begun and ended in the profiler's thread, where its recorder is written.
        span = portal.call(lambda: self._profiler.span(name, **attrs))
        portal.call(span.__enter__)
        try:
            yield
        except BaseException as exc:
            portal.call(span.__exit__, type(exc), exc, exc.__traceback__)
            raise
        portal.call(span.__exit__, None, None, None)

    def flush(self) -> None:
        """Write the manifest and the timeline recorded so far and wait until both are on
        disk (at most ``timeouts.stop_s``)."""
        self._open_portal().call(self._profiler.flush)

    def __enter__(self) -> BlockingProfiler:
        if self._status != "new":
            raise UsageError("a BlockingProfiler is opened once")
        with contextlib.ExitStack() as stack:
            portal = stack.enter_context(start_blocking_portal(name="aprof-profiler"))
            portal.call(self._profiler.__aenter__)
            self._portal, self._exit_portal = portal, stack.pop_all()
        self._status = "open"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop every open window and wait for all stops (bounded), write the manifest, and
        end the profiler's thread. Closing again does nothing."""
        if self._status != "open":
            self._status = "closed"
            return
        self._status = "closed"
        portal, exit_portal = self._portal, self._exit_portal
        try:
            if portal is not None:
                portal.call(self._profiler.aclose)
        finally:
            self._final = self._profiler.manifest
            self._portal = None
            if exit_portal is not None:
                exit_portal.close()

    def _open_portal(self) -> BlockingPortal:
        if self._portal is None or self._status != "open":
            raise UsageError("open the profiler first: `with aprof.BlockingProfiler(cfg) as prof:`")
        return self._portal
