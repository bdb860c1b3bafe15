"""verl 0.9.1's V1 trainer (``trainer.use_v1``, every ``trainer.v1.trainer_mode``) with aprof.

:func:`with_aprof` puts :class:`V1Mixin` first in a trainer class's order (``aprof.verl.hook``
does it to the class ``get_trainer_cls`` returns), so each mode's own hooks run inside it.
With an ``aprof`` block in verl's config:

- every global step is an aprof step, from ``on_step_begin`` to the metrics' computing (its
  weight sync, checkpoint and validation included);
- the trainer's stages are stages on the driver's timeline (:data:`STAGES`), once per
  mini-update when ``parameter_sync_step`` > 1; the wait for samples from the replay buffer
  (``on_sample_begin`` to ``on_sample_end``) is a span, not training time;
- in ``sync`` and ``colocate_async`` the step's rollout is over at ``on_sample_end`` (verl
  #7722): role captures held for it on shared devices start then; in ``separate_async`` the
  standalone replicas generate on across steps;
- verl's own profiler calls do nothing: aprof's windows replace them;
- the rollout client the agent loops get profiles each call to a replica; in
  ``separate_async``, the training replicas hybrid switching lends to generation are capture
  targets while lent (added and removed as the run goes on);
- each trajectory a step trains on carries its staleness, as verl counts it;
- the figures of each step go into the metrics verl logs (``aprof/...``): with the next
  step's, once every process's timeline of it arrived, and the last step's as the run ends
  (``aprof.verl._run.logged_figures``).

Without the block the class is verl's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aprof.verl._run import VerlRun, mixed

STAGES = {
    "_compute_reward_colocate": "reward",
    "_compute_old_log_prob": "old_log_prob",
    "_compute_ref_log_prob": "ref",
    "_compute_values": "values",
    "_compute_advantage": "adv",
    "_update_critic": "update_critic",
    "_update_actor": "update_actor",
    "_save_checkpoint": "save_checkpoint",
    "on_step_end": "update_weights",
    "_validate": "validation",
}
"""The V1 trainer's methods timed as stages, named as verl's own timers name them."""
ROLLOUT_ENDS_AT_SAMPLE = ("sync", "colocate_async")
"""Modes whose rollout of a step is over when its samples are taken (verl #7722)."""


def _staged(method: str) -> Callable[..., Any]:
    name = STAGES[method]

    def run(self: V1Mixin, *args: Any, **kwargs: Any) -> Any:
        call = getattr(super(V1Mixin, self), method)
        aprof = self._aprof
        if aprof is None:
            return call(*args, **kwargs)
        with aprof.stage(name):
            return call(*args, **kwargs)

    run.__name__ = method
    run.__doc__ = f"verl's ``{method}``, as stage ``{name}`` of the aprof step."
    return run


class V1Mixin:
    """Before a verl V1 ``PPOTrainer`` class: aprof's run, when verl's config asks for one."""

    _aprof: VerlRun | None = None
    _aprof_sampling: contextlib.ExitStack | None = None

    if TYPE_CHECKING:
        config: Any
        global_steps: int
        trainer_mode: str
        role_worker_mapping: dict[Any, Any]

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self._aprof = VerlRun.of(config)  # a config aprof cannot run is refused here
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()  # type: ignore[misc]
        if self._aprof is not None:
            self._aprof.profiled_workers(self.role_worker_mapping)

    def init(self) -> None:
        aprof = self._aprof
        if aprof is not None:
            aprof.open()
            aprof.send_spans(self.config)
        super().init()  # type: ignore[misc]
        if aprof is None:
            return
        trainer: Any = self
        managers = trainer._rollout_server_managers()
        aprof.add_servers([a for manager in managers for a in manager.server_addresses])
        groups = [(trainer.actor_rollout_wg, "actor")]
        ref = getattr(trainer, "ref_policy_wg", None)
        if trainer.use_reference_policy and ref is not None and ref is not trainer.actor_rollout_wg:
            groups.append((ref, "ref"))
        if trainer.use_critic:
            groups.append((trainer.critic_wg, "critic"))
        for group, role in groups:
            aprof.add_worker_group(group, role)

    # separate_async's hybrid switching: the training replicas lent to generation and back.
    def add_replicas_to_balancer(self) -> None:
        super().add_replicas_to_balancer()  # type: ignore[misc]
        if self._aprof is not None:
            manager: Any = getattr(self, "llm_server_manager", None)
            self._aprof.add_servers(manager.server_addresses)

    def remove_replicas_from_balancer(self) -> None:
        super().remove_replicas_from_balancer()  # type: ignore[misc]
        if self._aprof is not None:
            manager: Any = getattr(self, "llm_server_manager", None)
            self._aprof.remove_servers(range(len(manager.server_addresses)))

    def get_llm_client(self) -> Any:
        client = super().get_llm_client()  # type: ignore[misc]
        return client if self._aprof is None else self._aprof.client(client)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().fit(*args, **kwargs)  # type: ignore[misc]
        finally:
            if self._aprof is not None:
                self._aprof.close(getattr(self, "logger", None))

    def on_step_begin(self) -> None:
        if self._aprof is not None:
            self._aprof.begin_step(self.global_steps)
        super().on_step_begin()  # type: ignore[misc]

    def on_sample_begin(self) -> None:
        super().on_sample_begin()  # type: ignore[misc]
        if self._aprof is not None:
            self._aprof_sampling = contextlib.ExitStack()
            self._aprof_sampling.enter_context(self._aprof.stage("sample", training=False))

    def on_sample_end(self) -> None:
        try:
            super().on_sample_end()  # type: ignore[misc]
        finally:
            sampling, self._aprof_sampling = self._aprof_sampling, None
            if sampling is not None:
                sampling.close()
            if self._aprof is not None and self.trainer_mode in ROLLOUT_ENDS_AT_SAMPLE:
                self._aprof.rollout_ended()

    def _compute_metrics(
        self, batch: Any, metrics: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        if self._aprof is not None:
            self._aprof.trajectories(batch, self.global_steps)
            self._aprof.end_step()
            metrics.update(self._aprof.figures(self.global_steps - 1))
        return super()._compute_metrics(batch, metrics, *args, **kwargs)  # type: ignore[misc]

    # verl's own profiler: aprof's windows take its place.
    def _start_profiling(self) -> None:
        if self._aprof is None:
            super()._start_profiling()  # type: ignore[misc]

    def _stop_profiling(self) -> None:
        if self._aprof is None:
            super()._stop_profiling()  # type: ignore[misc]

    def _start_rollout_profiling(self) -> None:
        if self._aprof is None:
            super()._start_rollout_profiling()  # type: ignore[misc]

    def _stop_rollout_profiling(self) -> None:
        if self._aprof is None:
            super()._stop_rollout_profiling()  # type: ignore[misc]


for _method in STAGES:
    setattr(V1Mixin, _method, _staged(_method))


def with_aprof(trainer: type) -> type:
    """``trainer`` (a V1 ``PPOTrainer`` class) with :class:`V1Mixin` first."""
    return mixed(trainer, V1Mixin)
