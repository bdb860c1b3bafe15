"""aprof's run inside a verl trainer: what both trainer mixins (V1 and legacy) do.

:meth:`VerlRun.of` reads verl's config at launch (its ``aprof`` block, checked); the run then
opens a ``BlockingProfiler`` in verl's TaskRunner, makes the worker classes verl will start
profiled ones, adds verl's rollout servers and worker groups as capture targets, profiles
the rollout client, and gives each step's figures as verl metrics. Past the launch check,
nothing here raises into verl's training: a failure is logged and that part runs unprofiled.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from aprof._accounting import StepAccount
from aprof._config import ProfilerConfig
from aprof._core import BlockingProfiler
from aprof._errors import UsageError, describe
from aprof._logging import logger
from aprof.abc import CaptureTarget
from aprof.verl._launch import aprof_config

ROLES = {
    "actor_rollout": "actor",
    "actor_rollout_ref": "actor",
    "actor": "actor",
    "ref": "ref",
    "critic": "critic",
}
"""verl's ``Role`` (by its ``str``) and the aprof role its workers profile as."""


def figures(account: StepAccount, replicas: Collection[int]) -> dict[str, float]:
    """A step's figures as verl metrics (``aprof/<name>``), from its interval unions.

    ``trainer_idle_ratio`` is the share of the step's wall time with no trainer stage open;
    ``rollout_idle_ratio`` the share in which a replica had no request in flight, averaged
    over ``replicas``, those generating for the run (a replica no request reached was idle
    throughout; one lent back to training is not among them).
    """
    wall = account.wall_s
    found: dict[str, float | None] = {
        "step": float(account.step),
        "wall_s": wall,
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
    if wall > 0:
        found["trainer_idle_ratio"] = max(0.0, wall - account.train_s) / wall
        if replicas:
            busy = sum(min(r.busy_s, wall) for r in account.replicas if r.replica in replicas)
            found["rollout_idle_ratio"] = 1.0 - busy / (wall * len(replicas))
    if account.staleness is not None:
        found["staleness_mean"] = account.staleness["mean"]
        found["staleness_max"] = account.staleness["max"]
    return {f"aprof/{name}": value for name, value in found.items() if value is not None}


def logged_figures(
    prof: BlockingProfiler, step: int | None, replicas: Collection[int]
) -> dict[str, float]:
    """Step ``step`` (ended; ``None``: the latest that ended) as verl metrics, as far as the
    timelines written tell; none when it is not accounted, never an error.

    The driver's timeline is written first. The agent-loop workers' requests count once their
    reports arrived: they report after the step ended, so the figures verl logs with step
    ``n`` are those of step ``n - 1`` (``aprof/step`` says which), and the last step's are
    logged once the profiler closed, which waits for every worker's last report.
    """
    try:
        with contextlib.suppress(UsageError):  # closed: its timelines are all written
            prof.flush()
        account = prof.accounting(step)
        return {} if account is None else figures(account, replicas)
    except Exception as exc:  # a full disk, say: the step logs without them
        logger.warning("aprof figures not added", step=step, error=describe(exc))
        return {}


def log_last_figures(tracking: Any, prof: BlockingProfiler, replicas: Collection[int]) -> None:
    """Log the last step's figures with verl's logger ``tracking``, under that step, once
    ``prof`` closed."""
    found = logged_figures(prof, None, replicas)
    if tracking is None or not found:
        return
    try:
        tracking.log(data=found, step=int(found["aprof/step"]))
    except Exception as exc:  # verl's logger is verl's: the run goes on
        logger.warning("aprof figures not logged", error=describe(exc))


@contextlib.contextmanager
def stage(prof: BlockingProfiler | None, name: str, *, training: bool = True) -> Iterator[None]:
    """``prof.stage(name)`` around the body (``training=False``: ``prof.span``, time that is
    not training, such as a wait for samples), whose own errors alone reach the trainer."""
    entered: AbstractContextManager[None] | None = None
    if prof is not None:
        try:
            opened = prof.stage(name) if training else prof.span(name)
            opened.__enter__()
            entered = opened
        except Exception as exc:  # a closed profiler: the stage runs unrecorded
            logger.warning("aprof stage not recorded", stage=name, error=describe(exc))
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


class OpenStep:
    """A profiler's step begun in one of verl's hooks and ended in another."""

    def __init__(self) -> None:
        self._entered: AbstractContextManager[int] | None = None

    @property
    def open(self) -> bool:
        return self._entered is not None

    def begin(self, prof: BlockingProfiler | None, step: int) -> None:
        """Step ``step`` of ``prof`` begins (the one open before it ends first)."""
        self.end()
        if prof is None:
            return
        try:
            entered = prof.step(step)
            entered.__enter__()
        except Exception as exc:  # a closed profiler, say: the trainer goes on unprofiled
            logger.warning("aprof step did not open", step=step, error=describe(exc))
            return
        self._entered = entered

    def end(self) -> None:
        """The open step ends; nothing when none is open."""
        entered, self._entered = self._entered, None
        if entered is None:
            return
        try:
            entered.__exit__(None, None, None)
        except Exception as exc:  # the observer never stops the trainer
            logger.warning("aprof step did not close", error=describe(exc))


_MIXED: dict[tuple[type, ...], type] = {}


def mixed(trainer: type, *mixins: type) -> type:
    """``trainer`` with ``mixins`` first in its order, named ``Aprof<trainer>``: the same
    class each time for the same trainer; a trainer that has them already as it is."""
    if issubclass(trainer, mixins[0]):
        return trainer
    key = (trainer, *mixins)
    found = _MIXED.get(key)
    if found is None:
        name = f"Aprof{trainer.__name__}"
        module = mixins[0].__module__
        namespace = {"__qualname__": name, "__module__": module, "__doc__": trainer.__doc__}
        found = _MIXED[key] = type(name, (*mixins, trainer), namespace)
    return found


class VerlRun:
    """The profiler of one verl training run, in verl's TaskRunner."""

    def __init__(self, config: ProfilerConfig, verl_config: Any) -> None:
        self.config = config
        self._verl = verl_config
        self._profiler: BlockingProfiler | None = None
        self._step = OpenStep()
        self._rollout_over = False
        self._handle: Any = None
        self.addresses: list[str] = []
        """The rollout servers in replica order: replica ``i`` is ``addresses[i]``."""
        self._servers: dict[int, str] = {}
        """The replicas that are capture targets now, and their targets' names."""

    @classmethod
    def of(cls, verl_config: Any) -> VerlRun | None:
        """The run verl's config asks for (its ``aprof`` block), ``None`` without one.

        Raises ``ConfigError`` naming the key when the block, or verl's own profiler settings
        beside it, cannot be run as asked: the launch is refused.
        """
        from omegaconf import OmegaConf

        plain = OmegaConf.to_container(verl_config, resolve=True)
        config = aprof_config(plain if isinstance(plain, dict) else {})
        return None if config is None else cls(config, verl_config)

    @property
    def profiler(self) -> BlockingProfiler | None:
        """The run's profiler, open; ``None`` before :meth:`open`, after :meth:`close`, or
        when it did not open."""
        return self._profiler

    # -- before the workers start -------------------------------------------------------------

    def profiled_workers(self, mapping: dict[Any, Any]) -> None:
        """Make each Ray worker class of verl's ``role_worker_mapping`` (role -> class) one
        whose verl stages feed aprof, in place; roles aprof does not know stay verl's."""
        import ray

        from aprof.verl._workers import profiled_worker

        for role, actor_class in list(mapping.items()):
            name = ROLES.get(str(role))
            worker_cls = getattr(actor_class, "__ray_actor_class__", None)
            if name is None or worker_cls is None:
                continue
            try:
                mapping[role] = ray.remote(profiled_worker(worker_cls, self.config, role=name))
            except Exception as exc:
                logger.error("aprof: worker not profiled", role=str(role), error=describe(exc))

    # -- the profiler -------------------------------------------------------------------------

    def open(self) -> None:
        """Open the profiler (the run is then shared with the agent-loop workers)."""
        try:
            prof = BlockingProfiler(self.config)
            prof.__enter__()
        except Exception as exc:
            logger.error("aprof profiler did not open: the run is unprofiled", error=describe(exc))
            return
        self._profiler = prof

    def send_spans(self, verl_config: Any) -> None:
        """With ``otel.receive``: the vLLM servers verl is about to launch export their
        request spans to the run's receiver (engine arguments set in verl's config: the
        endpoint, and the request stats vLLM's tracing reads)."""
        endpoint = None if self._profiler is None else self._profiler.otel_endpoint
        if endpoint is None:
            return
        rollout = verl_config.actor_rollout_ref.rollout
        if rollout.name != "vllm":
            logger.warning(
                "aprof: otel.receive takes vLLM's request spans only", engine=rollout.name
            )
            return
        from omegaconf import open_dict

        with open_dict(verl_config):
            rollout.engine_kwargs.vllm.otlp_traces_endpoint = endpoint.rstrip("/") + "/v1/traces"
            # vLLM traces a request from its stats: without them its output loop fails.
            rollout.disable_log_stats = False

    def add_servers(self, addresses: Sequence[str]) -> None:
        """verl's rollout servers as capture targets: replica ``i`` at ``addresses[i]``
        (``host:port``), the first of the run's; a replica that is a target stays one."""
        self.addresses[: len(addresses)] = addresses
        for replica, address in enumerate(addresses):
            if replica not in self._servers:
                made = self._add(
                    lambda r=replica, a=address: self._server(r, a), f"replica {replica}"
                )
                if made is not None:
                    self._servers[replica] = made

    def remove_servers(self, replicas: Sequence[int]) -> None:
        """Replicas that no longer generate for the run (lent back to training) stop being
        capture targets; their window open now, if any, ends."""
        for replica in replicas:
            name = self._servers.pop(replica, None)
            if name is None or self._profiler is None:
                continue
            try:
                self._profiler.remove_target(name)
            except Exception as exc:
                logger.warning("aprof: target not removed", target=name, error=describe(exc))

    def add_worker_group(self, group: Any, role: str) -> None:
        """A verl worker group (its workers made by :meth:`profiled_workers`) as ``role``."""
        from aprof.verl._workers import worker_group

        self._add(lambda: worker_group(group, role, self.config), f"role {role}")

    def _add(self, make: Any, what: str) -> str | None:
        """The name of the target ``make()`` gives, added; ``None`` when it was not."""
        if self._profiler is None:
            return None
        try:
            target: CaptureTarget = make()
            self._profiler.add_target(target)
        except Exception as exc:
            logger.error("aprof: target not added", target=what, error=describe(exc))
            return None
        return target.name

    def _server(self, replica: int, address: str) -> CaptureTarget:
        """The capture target of one of verl's servers, as verl launched it: its engine and
        version, and the folder verl's rollout profiler settings give its traces."""
        rollout = self._verl.actor_rollout_ref.rollout
        url = f"http://{address}"
        if rollout.name == "sglang":
            from servers import SGLangServer

            return SGLangServer(url, replica=replica, version=importlib.metadata.version("sglang"))
        from servers import VLLMServer

        save_path = rollout.profiler.get("save_path") or self._verl.global_profiler.save_path
        return VLLMServer(
            url,
            replica=replica,
            version=importlib.metadata.version("vllm"),
            profiler_dir=f"{save_path}/agent_loop_rollout_replica_{replica}",
        )

    def client(self, client: Any) -> Any:
        """verl's rollout client with each call to a replica an aprof request (the run
        shared with the agent-loop worker processes it is sent to)."""
        if self._profiler is None:
            return client
        try:
            from aprof.ray import share
            from aprof.verl._client import profiled

            if self._handle is None:
                self._handle = share(self._profiler)
            return profiled(
                client, profiler=self._handle, replicas=self.addresses, trace_context=True
            )
        except Exception as exc:
            logger.error("aprof: rollout client not profiled", error=describe(exc))
            return client

    # -- each step ----------------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Global step ``step`` begins (the one open before it ends first)."""
        self._step.begin(self._profiler, step)
        self._rollout_over = False

    def end_step(self) -> None:
        """The open step ends; nothing when none is open."""
        self._step.end()

    def rollout_ended(self) -> None:
        """The open step's rollout is over (said once per step)."""
        if self._profiler is None or not self._step.open or self._rollout_over:
            return
        self._rollout_over = True
        try:
            self._profiler.rollout_ended()
        except Exception as exc:
            logger.warning("aprof rollout end not told", error=describe(exc))

    def stage(self, name: str, *, training: bool = True) -> AbstractContextManager[None]:
        """The body as a stage on the driver's timeline (:func:`stage`)."""
        return stage(self._profiler, name, training=training)

    def trajectories(self, batch: Any, step: int) -> None:
        """The staleness of each trajectory of ``batch`` (verl's ``KVBatchMeta``) that step
        ``step`` trains on, as verl counts it: how many weight versions the newest weights
        that generated it lag behind the ones being trained (``step - 1 -
        max_global_steps``), on the driver's timeline in the open step."""
        if self._profiler is None or not self._step.open:
            return
        try:
            for tag in getattr(batch, "tags", ()):
                version = tag.get("max_global_steps")
                if isinstance(version, int) and not tag.get("is_padding", False):
                    with self._profiler.span("trajectory", staleness=step - 1 - version):
                        pass  # zero-length: the span carries its attrs and its step only
        except Exception as exc:
            logger.warning("aprof staleness not recorded", step=step, error=describe(exc))

    def figures(self, step: int) -> dict[str, float]:
        """Step ``step`` (ended) as verl metrics (:func:`logged_figures`)."""
        if self._profiler is None:
            return {}
        return logged_figures(self._profiler, step, set(self._servers))

    def close(self, tracking: Any = None) -> None:
        """End the open step and close the profiler (its manifest written); then log the
        last step's figures with verl's logger ``tracking``, when given."""
        self.end_step()
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        try:
            prof.close()
        except Exception as exc:
            logger.error("aprof profiler did not close cleanly", error=describe(exc))
        log_last_figures(tracking, prof, set(self._servers))
