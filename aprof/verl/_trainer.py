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
captures held for it, ``colocated``, start). ``_update_actor``'s output carries the
latest accounted step's figures (``aprof/rollout_s``, ``aprof/idle_s``, ``aprof/tail_s``, ...,
:data:`METRICS`) in its ``meta_info["metrics"]``, which ``fit()`` reduces into the metrics it
logs that step: they reach verl's own loggers (console, wandb, tensorboard) without a file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, NamedTuple

from aprof._accounting import StepAccount
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

TRAINER_STAGES = {
    "_compute_old_log_prob": "old_log_prob",
    "_compute_ref_log_prob": "ref",
    "_compute_values": "values",
    "_update_critic": "update_critic",
    "_update_actor": "update_actor",
}
"""verl 0.9.1 ``RayPPOTrainer`` methods (each takes the batch) and their stage names, as
``fit()``'s own timers name them."""


def metrics(account: StepAccount) -> dict[str, float]:
    """A step's figures as verl metrics (``aprof/<name>``; the step they are of is
    ``aprof/step``: the latest accounted, the one before the step that logs them)."""
    found = {
        "step": float(account.step),
        "wall_s": account.wall_s,
        "rollout_s": account.rollout_s,
        "train_s": account.train_s,
        "overlap_s": account.overlap_s,
        "idle_s": account.idle_s,
        "requests": float(account.requests),
        "latency_p50_s": account.p50_s,
        "latency_p99_s": account.p99_s,
        "tail_s": account.tail_s,
        "imbalance": account.imbalance,
    }
    return {f"aprof/{name}": value for name, value in found.items() if value is not None}


METRICS = tuple(
    f"aprof/{name}"
    for name in (
        "step",
        "wall_s",
        "rollout_s",
        "train_s",
        "overlap_s",
        "idle_s",
        "requests",
        "latency_p50_s",
        "latency_p99_s",
        "tail_s",
        "imbalance",
    )
)
"""The metrics ``_update_actor``'s output carries (those without a value left out)."""


@contextlib.contextmanager
def _stage(prof: BlockingProfiler | None, name: str) -> Iterator[None]:
    """``prof.stage(name)`` around the body, whose own errors alone reach the trainer."""
    entered: AbstractContextManager[None] | None = None
    if prof is not None:
        try:
            entered = prof.stage(name)
            entered.__enter__()
        except Exception as exc:  # a closed profiler: the stage runs unrecorded
            logger.warning("aprof stage not recorded", stage=name, error=describe(exc))
            entered = None
    failure: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        if entered is not None:
            try:
                if failure is None:
                    entered.__exit__(None, None, None)
                else:
                    entered.__exit__(type(failure), failure, failure.__traceback__)
            except Exception as exc:
                logger.warning("aprof stage not recorded", stage=name, error=describe(exc))


class ProfiledTrainerMixin:
    """Put before verl's ``RayPPOTrainer`` (or a subclass): while ``aprof_profiler`` is set,
    every global step of ``fit()`` runs as ``with aprof_profiler.step(self.global_steps):``.

    A step that ends by an exception (``fit()`` does not reach its stop) is closed as the next
    step begins, or when the profiler closes.
    """

    aprof_profiler: BlockingProfiler | None = None
    """The driver's profiler, open; ``None``: the trainer runs as verl's own."""
    _aprof_step: AbstractContextManager[int] | None = None
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
        output = self._aprof_stage("_update_actor", batch)
        prof = self.aprof_profiler
        if prof is None:
            return output
        try:
            account = prof.accounting()
            found = getattr(output, "meta_info", None)
            if account is not None and isinstance(found, dict):
                logged = found.setdefault("metrics", {})
                if isinstance(logged, dict):
                    logged.update({k: [v] for k, v in metrics(account).items()})
        except Exception as exc:  # the observer never stops the trainer
            logger.warning("aprof metrics not added", error=describe(exc))
        return output

    def _aprof_stage(self, method: str, batch: Any) -> Any:
        """verl's ``method`` on ``batch``, as a stage on the driver's timeline; the step's
        first says its rollout is over."""
        run = getattr(super(), method)
        prof = self.aprof_profiler
        if prof is not None and self._aprof_step is not None and not self._aprof_rollout_over:
            self._aprof_rollout_over = True
            try:
                prof.rollout_ended()
            except Exception as exc:  # the observer never stops the trainer
                logger.warning("aprof rollout end not told", error=describe(exc))
        with _stage(prof, TRAINER_STAGES[method]):
            return run(batch)

    def _aprof_leave(self) -> None:
        entered, self._aprof_step = self._aprof_step, None
        if entered is None:
            return
        try:
            entered.__exit__(None, None, None)
        except Exception as exc:  # the observer never stops the trainer
            logger.warning("aprof step did not close", error=describe(exc))
