"""verl 0.9.1's legacy trainer (``trainer.use_v1=False``: ``RayPPOTrainer``) with aprof, by
configuration.

:func:`with_aprof` puts :class:`LegacyMixin` and ``ProfiledTrainerMixin`` before the trainer
class (``aprof.verl.hook`` rebinds ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` to it).
With an ``aprof`` block in verl's config, the run opens as ``init_workers()`` begins: the
worker classes verl was given are profiled ones, the rollout client ``init_workers()`` makes
for the agent loops profiles each call to a replica, and verl's servers and worker groups are
capture targets; ``ProfiledTrainerMixin`` makes each global step an aprof step. Without the
block the class is verl's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from aprof.verl._run import VerlRun, mixed
from aprof.verl._trainer import ProfiledTrainerMixin


@contextlib.contextmanager
def _profiled_clients(run: VerlRun) -> Iterator[None]:
    """While ``init_workers()`` runs: the rollout client verl's server manager makes is a
    profiled one, its servers the run's rollout targets."""
    from verl.workers.rollout.llm_server import LLMServerManager

    get_client = LLMServerManager.get_client

    def profiled_get_client(manager: Any, *args: Any, **kwargs: Any) -> Any:
        client = get_client(manager, *args, **kwargs)
        if run.addresses:  # the rollout's client is made first; others are not profiled
            return client
        run.add_servers(manager.get_addresses())
        return run.client(client)

    LLMServerManager.get_client = profiled_get_client
    try:
        yield
    finally:
        LLMServerManager.get_client = get_client


class LegacyMixin:
    """Before ``ProfiledTrainerMixin`` and verl's ``RayPPOTrainer``: aprof's run, when verl's
    config asks for one."""

    _aprof: VerlRun | None = None
    aprof_profiler: Any
    aprof_tracking: Any

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self._aprof = run = VerlRun.of(config)  # a config aprof cannot run is refused here
        if run is not None:
            mapping = kwargs.get("role_worker_mapping", args[1] if len(args) > 1 else None)
            if isinstance(mapping, dict):
                run.profiled_workers(mapping)
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]

    def init_workers(self) -> None:
        run = self._aprof
        if run is None:
            super().init_workers()  # type: ignore[misc]
            return
        run.open()
        run.send_spans(self.config)  # type: ignore[attr-defined]
        self.aprof_profiler = run.profiler
        with _profiled_clients(run):
            super().init_workers()  # type: ignore[misc]
        trainer: Any = self
        run.add_worker_group(trainer.actor_rollout_wg, "actor")
        ref = getattr(trainer, "ref_policy_wg", None)
        if trainer.use_reference_policy and ref is not None and ref is not trainer.actor_rollout_wg:
            run.add_worker_group(ref, "ref")
        if trainer.use_critic:
            run.add_worker_group(trainer.critic_wg, "critic")

    def fit(self) -> Any:
        try:
            return super().fit()  # type: ignore[misc]
        finally:
            if self._aprof is not None:
                self.aprof_profiler = None
                self._aprof.close(self.aprof_tracking)


def with_aprof(trainer: type) -> type:
    """``trainer`` (verl's ``RayPPOTrainer`` or a subclass) with aprof's mixins first."""
    return mixed(trainer, LegacyMixin, ProfiledTrainerMixin)
