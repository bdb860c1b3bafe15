"""verl's trainer with aprof: each global step of ``RayPPOTrainer.fit()`` is an aprof step,
and the agent loops ``init_workers()`` starts gate and count through aprof.

verl 0.9.1's ``fit()`` calls ``self._start_profiling(do_profile)`` as each step begins and
``self._stop_profiling(do_profile, run_command=...)`` as it ends, every step, whether verl
profiles it or not: the mixin opens and closes the aprof step there, after verl's own start
and before verl's own stop (both do nothing once the plan's overrides turn verl's profiler off).
``init_workers()`` makes the agent-loop manager (the class verl's config names): while it runs,
:data:`SHARING` holds the shared profiler for ``aprof.verl.ProfiledAgentLoopManager``.

The trainer's calls into its worker groups (:data:`TRAINER_STAGES`: old log-probs, reference,
values, critic and actor updates) run as ``prof.stage(...)`` on the driver's timeline, in every
step, so ``aprof report`` counts them as training time; the step's first one follows its
generation, and tells the profiler the rollout is over (``prof.rollout_ended()``: role
captures held for it, ``colocated``, start). The figures of each step (``aprof/rollout_s``,
``aprof/trainer_idle_ratio``, ``aprof/tail_s``, ...: ``aprof.verl._run.figures``) join the
metrics ``fit()`` logs for the next step (the step's agent-loop requests are reported after it
ends; ``aprof/step`` names it): while ``fit()`` runs, the ``Tracking`` logger it makes
(``verl.utils.tracking.Tracking``, imported as ``fit()`` begins) adds them to each ``log``
call, so they reach verl's own loggers (console, file, wandb, tensorboard).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, NamedTuple

from aprof._core import BlockingProfiler
from aprof._errors import describe
from aprof._logging import logger
from aprof.ray._share import ShareHandle, share
from aprof.verl._run import OpenStep, logged_figures, stage


class Sharing(NamedTuple):
    """The driver's profiler as the agent-loop manager made in ``init_workers()`` takes it."""

    handle: ShareHandle
    replicas: Callable[[], list[str]]
    """The rollout servers' addresses in replica order (verl's ``get_addresses()``)."""


SHARING: ContextVar[Sharing | None] = ContextVar("aprof_verl_sharing", default=None)

TRACKING = "verl.utils.tracking"
"""The module of the logger class (``Tracking``) verl's ``fit()`` imports as it begins."""
TRAINER_STAGES = {
    "_compute_old_log_prob": "old_log_prob",
    "_compute_ref_log_prob": "ref",
    "_compute_values": "values",
    "_update_critic": "update_critic",
    "_update_actor": "update_actor",
}
"""verl 0.9.1 ``RayPPOTrainer`` methods (each takes the batch) and their stage names, as
``fit()``'s own timers name them."""


def replicas(trainer: Any) -> range:
    """The rollout replicas of verl's trainer."""
    manager = getattr(trainer, "llm_server_manager", None)
    return range(0 if manager is None else len(manager.get_addresses()))


def _with_figures(tracking: Any, prof: BlockingProfiler, trainer: Any) -> Any:
    """verl's ``Tracking`` whose loggers add the figures of the step before to what each
    ``log`` gets (``aprof.verl._run.logged_figures``); the logger ``fit()`` made is kept as
    the trainer's ``aprof_tracking``, for the last step's."""

    def make(*args: Any, **kwargs: Any) -> Any:
        made = tracking(*args, **kwargs)
        log = made.log

        def log_figures(data: dict[str, Any], step: int, *more: Any, **named: Any) -> Any:
            if "aprof/step" not in data:  # not the last step's, logged as they are
                data = {**data, **logged_figures(prof, step - 1, replicas(trainer))}
            return log(data, step, *more, **named)

        made.log = log_figures
        trainer.aprof_tracking = made
        return made

    return make


class ProfiledTrainerMixin:
    """Put before verl's ``RayPPOTrainer`` (or a subclass): while ``aprof_profiler`` is set,
    every global step of ``fit()`` runs as ``with aprof_profiler.step(self.global_steps):``.

    A step that ends by an exception (``fit()`` does not reach its stop) is closed as the next
    step begins, or when the profiler closes.
    """

    aprof_profiler: BlockingProfiler | None = None
    """The driver's profiler, open; ``None``: the trainer runs as verl's own."""
    aprof_tracking: Any = None
    """The logger ``fit()`` made, once it made one: the last step's figures are logged with
    it after the profiler closed (``aprof.verl._run.log_last_figures``)."""
    _aprof_step: OpenStep | None = None
    _aprof_rollout_over = False
    """The open step's rollout was said to be over (its first training stage began)."""

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
        step: Any = getattr(self, "global_steps", None)
        if self.aprof_profiler is None or not isinstance(step, int):
            return
        if self._aprof_step is None:
            self._aprof_step = OpenStep()
        self._aprof_step.begin(self.aprof_profiler, step)
        self._aprof_rollout_over = False

    def _stop_profiling(self, do_profile: bool, run_command: bool = False) -> None:
        try:
            self._aprof_leave()
        finally:
            super()._stop_profiling(do_profile, run_command=run_command)  # type: ignore[misc]

    def _compute_old_log_prob(self, batch: Any) -> Any:
        return self._aprof_stage("_compute_old_log_prob", batch)

    def _compute_ref_log_prob(self, batch: Any) -> Any:
        return self._aprof_stage("_compute_ref_log_prob", batch)

    def _compute_values(self, batch: Any) -> Any:
        return self._aprof_stage("_compute_values", batch)

    def _update_critic(self, batch: Any) -> Any:
        return self._aprof_stage("_update_critic", batch)

    def _update_actor(self, batch: Any) -> Any:
        return self._aprof_stage("_update_actor", batch)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """verl's, each step's figures added to the metrics it logs for that step."""
        fit = super().fit  # type: ignore[misc]
        prof = self.aprof_profiler
        if prof is None:
            return fit(*args, **kwargs)
        try:
            module = importlib.import_module(TRACKING)
            tracking = module.Tracking
        except (ImportError, AttributeError) as exc:
            logger.warning("aprof figures not logged: no verl logger", error=describe(exc))
            return fit(*args, **kwargs)
        trainer: Any = self
        setattr(module, "Tracking", _with_figures(tracking, prof, trainer))  # noqa: B010
        try:
            return fit(*args, **kwargs)
        finally:
            setattr(module, "Tracking", tracking)  # noqa: B010

    def _aprof_stage(self, method: str, batch: Any) -> Any:
        """verl's ``method`` on ``batch``, as a stage on the driver's timeline; the step's
        first says its rollout is over."""
        run = getattr(super(), method)
        prof = self.aprof_profiler
        opened = self._aprof_step is not None and self._aprof_step.open
        if prof is not None and opened and not self._aprof_rollout_over:
            self._aprof_rollout_over = True
            try:
                prof.rollout_ended()
            except Exception as exc:  # the observer never stops the trainer
                logger.warning("aprof rollout end not told", error=describe(exc))
        with stage(prof, TRAINER_STAGES[method]):
            return run(batch)

    def _aprof_leave(self) -> None:
        if self._aprof_step is not None:
            self._aprof_step.end()
