"""verl's trainer with aprof: each global step of ``RayPPOTrainer.fit()`` is an aprof step,
and the agent loops ``init_workers()`` starts gate and count through aprof.

verl 0.9.1's ``fit()`` calls ``self._start_profiling(do_profile)`` as each step begins and
``self._stop_profiling(do_profile, run_command=...)`` as it ends, every step, whether verl
profiles it or not: the mixin opens and closes the aprof step there, after verl's own start
and before verl's own stop (both do nothing once the plan's overrides turn verl's profiler off).
``init_workers()`` makes the agent-loop manager (the class verl's config names): while it runs,
:data:`SHARING` holds the shared profiler for ``aprof.verl.ProfiledAgentLoopManager``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, NamedTuple

from aprof._core import BlockingProfiler
from aprof._errors import describe
from aprof._logging import logger
from aprof.ray._share import ShareHandle, share


class Sharing(NamedTuple):
    """The driver's profiler as the agent-loop manager made in ``init_workers()`` takes it."""

    handle: ShareHandle
    replicas: Callable[[], list[str]]
    """The rollout servers' addresses in replica order (verl's ``get_addresses()``)."""


SHARING: ContextVar[Sharing | None] = ContextVar("aprof_verl_sharing", default=None)


class ProfiledTrainerMixin:
    """Put before verl's ``RayPPOTrainer`` (or a subclass): while ``aprof_profiler`` is set,
    every global step of ``fit()`` runs as ``with aprof_profiler.step(self.global_steps):``.

    A step that ends by an exception (``fit()`` does not reach its stop) is closed as the next
    step begins, or when the profiler closes.
    """

    aprof_profiler: BlockingProfiler | None = None
    """The driver's profiler, open; ``None``: the trainer runs as verl's own."""
    _aprof_step: AbstractContextManager[int] | None = None

    def init_workers(self) -> None:
        """verl's, sharing ``aprof_profiler`` (set and open by then) with the agent loops."""
        prof = self.aprof_profiler
        if prof is None:
            super().init_workers()  # type: ignore[misc]
            return
        trainer: Any = self
        sharing = Sharing(share(prof), lambda: list(trainer.llm_server_manager.get_addresses()))
        token = SHARING.set(sharing)
        try:
            super().init_workers()  # type: ignore[misc]
        finally:
            SHARING.reset(token)

    def _start_profiling(self, do_profile: bool) -> None:
        super()._start_profiling(do_profile)  # type: ignore[misc]
        self._aprof_leave()
        prof = self.aprof_profiler
        step: Any = getattr(self, "global_steps", None)
        if prof is None or not isinstance(step, int):
            return
        try:
            entered = prof.step(step)
            entered.__enter__()
        except Exception as exc:  # a closed profiler, say: the trainer goes on unprofiled
            logger.warning("aprof step did not open", step=step, error=describe(exc))
            return
        self._aprof_step = entered

    def _stop_profiling(self, do_profile: bool, run_command: bool = False) -> None:
        try:
            self._aprof_leave()
        finally:
            super()._stop_profiling(do_profile, run_command=run_command)  # type: ignore[misc]

    def _aprof_leave(self) -> None:
        entered, self._aprof_step = self._aprof_step, None
        if entered is None:
            return
        try:
            entered.__exit__(None, None, None)
        except Exception as exc:  # the observer never stops the trainer
            logger.warning("aprof step did not close", error=describe(exc))
