"""The profiler: the public API of one run, and the collaborators it is made of.

- ``targets.py``: the capture targets and what the config selects of them;
- ``windows.py``: opening and closing windows, and telling everyone of their moves;
- ``window_machine.py``: one window's life (its phases and the moves between them);
- ``target_machine.py``: one target driven through its windows: start, poll, stop;
- ``steps.py``: entering and leaving global steps;
- ``plan.py``: which steps are captured, on which targets, and why;
- ``on_demand.py``: capture requests and triggers deciding that at run time, and the status;
- ``admission.py``: requests entering the open step, gated while their window starts;
- ``colocation.py``: captures on shared accelerators never running at once;
- ``disk_guard.py``: no capture starts while the manifest cannot be written;
- ``process_timeline.py``: this process's timeline;
- ``serving.py``: what other processes see and send (``aprof.ray``).

The profiler only builds and composes them: each is handed the others it tells, or their
public methods (registered once both are built where one needs the other first), and none
calls back into the profiler.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Literal

import structlog

from aprof._accounting import StepAccount
from aprof._config import ProfilerConfig, load_config
from aprof._control import CaptureAnswer, CaptureRequest
from aprof._core.accounting import LiveAccounting
from aprof._core.admission import Admission
from aprof._core.colocation import Colocation
from aprof._core.disk_guard import DiskGuard
from aprof._core.on_demand import Control
from aprof._core.plan import Plan
from aprof._core.process_timeline import ProcessTimeline, Recording
from aprof._core.serving import Serving
from aprof._core.steps import Steps
from aprof._core.target_machine import TargetMachine
from aprof._core.targets import Targets, rollout_replica
from aprof._core.windows import Windows, wait
from aprof._errors import ConfigError, UsageError
from aprof._layout import OutputLayout
from aprof._logging import configure_logging, logger
from aprof._manifest import Clock, Manifest, ManifestFiles, OtelRecord
from aprof._otel import OtelReceiver
from aprof._timeline.recorder import Requests, requests
from aprof.abc import CaptureTarget


class Profiler(Recording):
    """Opens, starts and stops the captures of the selected global steps, exactly once each.

    Use it as ``async with Profiler(cfg) as prof:``; inside, ``async with prof.step(n):``
    for each global step and ``async with prof.request(replica=r):`` around each request;
    ``prof.span(name, **attrs)`` records turns and tool calls on the timeline.
    """

    request: Requests
    """``prof.request(replica=r, request_id=None)``: the context of one request to replica
    ``r`` (a :class:`~aprof.Request`): gate, count, and report what happened. Made in C
    where the recorder is: no Python frame runs per request."""

    def __init__(
        self, config: ProfilerConfig | Mapping[str, object] | str | os.PathLike[str] | None = None
    ) -> None:
        self.config = load_config(config)
        """The resolved configuration."""
        cfg = self.config
        if not structlog.is_configured():
            configure_logging(cfg.log.format, cfg.log.level)
        self._layout = layout = OutputLayout(cfg.global_profiler.save_path)
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        """This run's identifier, as its manifest and its timelines name it."""
        self._manifest = Manifest(
            run_id=self.run_id,
            clock=Clock(wall_ns=time.time_ns(), monotonic_ns=time.monotonic_ns()),
            save_path=str(layout.root),
            config=cfg.model_dump(mode="json"),
        )
        self._status: Literal["new", "open", "closed"] = "new"
        self._log = log = logger.bind(run_id=self.run_id)
        self._files = files = ManifestFiles(self._manifest, layout)
        self._guard = DiskGuard(files, log)
        self._disk = ThreadPoolExecutor(1, thread_name_prefix="aprof-disk")
        """Makes window folders and sizes their files: one thread, so that many windows at
        once do not crowd the event loop's thread out of the GIL."""
        self._accounting = LiveAccounting()
        salt = self._manifest.trace_salt = _trace_salt()
        self._otel = (
            OtelReceiver(cfg.otel, root=layout.root, salt=salt, on_taken=files.otel_counts)
            if cfg.otel.receive
            else None
        )
        self._timeline = ProcessTimeline(
            cfg.timeline,
            root=layout.root,
            process=cfg.timeline.process or f"driver-{os.getpid()}",
            clock=self._manifest.clock,
            on_files=files.list_timeline,
            on_ledger=self._accounting.take,
        )
        self._targets = Targets(cfg, log)
        self._windows = Windows(
            cfg,
            targets=self._targets,
            layout=layout,
            run_id=self.run_id,
            files=files,
            timeline=self._timeline,
            refused=self._guard.refused,
            log=log,
        )
        self._guard.listen(self._windows.stop_early)
        files.before_write(self._windows.write_counts)
        self._plan = Plan(cfg, self._targets)
        self._control = Control(
            cfg,
            plan=self._plan,
            files=files,
            layout=layout,
            run_id=self.run_id,
            disk=self._disk,
            windows=self._windows,
            guard=self._guard,
            log=log,
        )
        self._colocation = Colocation(cfg, self._targets, self._windows)
        self._admission = Admission(cfg, self._targets, self._windows, self._colocation)
        self._gate = gate = self._admission.gate
        gate.trace_salt = salt
        self._recorder = self._timeline.recorder
        self.request = requests(gate, self._recorder)
        self._serving = Serving(
            cfg,
            targets=self._targets,
            windows=self._windows,
            admission=self._admission,
            files=files,
            decide=self._control.capture,
            add_target=self.add_target,
            remove_target=self.remove_target,
            accounting=self._accounting,
            log=log,
        )
        """What other processes reach of this profiler once it is shared (``aprof.ray``)."""
        self._targets.make_machines(
            partial(
                TargetMachine,
                timeouts=cfg.timeouts,
                limits=cfg.limits,
                layout=layout,
                disk=self._disk,
                on_note=self._windows.note,
                on_timeline=self._serving.take_timeline,
            )
        )
        self._steps = Steps(
            cfg,
            targets=self._targets,
            windows=self._windows,
            admission=self._admission,
            guard=self._guard,
            timeline=self._timeline,
            serving=self._serving,
            plan=self._plan,
            control=self._control,
            colocation=self._colocation,
        )

    # -- public API -------------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The live manifest of this run, with the windows of its latest steps (all of them
        until it holds 2,000; ``aprof.load_manifest(save_path)`` reads every one back)."""
        return self._manifest

    @property
    def save_path(self) -> Path:
        """The absolute folder everything of this run is written into."""
        return self._layout.root

    @property
    def current_step(self) -> int | None:
        """The global step now open, if any."""
        return self._steps.current

    @property
    def otel_endpoint(self) -> str | None:
        """The base URL of the run's OTLP/HTTP receiver (``/v1/traces`` below it) while the
        profiler is open with ``otel.receive``; ``None`` otherwise."""
        return None if self._otel is None else self._otel.endpoint

    def accounting(self, step: int | None = None) -> StepAccount | None:
        """Where step ``step`` (default: the latest that ended) went: its phases, requests,
        replicas, from every process's timeline written so far (``None``: not written yet,
        or older than the last 16 steps, or the timeline is off). No anomaly is judged here:
        ``aprof report`` does that over the whole run."""
        return self._accounting.account(step)

    def add_target(self, target: CaptureTarget) -> None:
        """Register a capture target; raises ``TargetError`` (a ``ValueError``) if it breaks
        the protocol's rules and ``UsageError`` once the profiler is closed."""
        if self._status == "closed":
            raise UsageError("the profiler is closed")
        self._targets.add(target)

    def remove_target(self, name: str) -> None:
        """Unregister the capture target ``name``, at any time, inside a step too: its window
        open now, if any, ends (``stop_reason: removed``; the stop is sent when its start
        succeeded), and the target's resources are released once its stops are done. A
        target added later, under that name or for that replica, is a new one: like any
        target added during a step, it takes part from the next step. Raises
        ``TargetError`` for a name no target has, ``UsageError`` once the profiler is
        closed."""
        if self._status == "closed":
            raise UsageError("the profiler is closed")
        machine = self._targets.remove(name)
        self._plan.forget(name, rollout_replica(machine.target))
        runs = self._steps.forget(name) + self._admission.forget(machine)
        self._windows.retire(machine, runs)

    def rollout_ended(self) -> None:
        """The open step's rollout is over (verl: generation has ended; its training stages
        follow): its rollout windows end now (``stop_reason: rollout_end``), none opens
        again in this step, and a role window held until then (``colocated``) starts. Does
        nothing outside a step; raises ``UsageError`` once the profiler is closed."""
        if self._status == "closed":
            raise UsageError("the profiler is closed")
        self._steps.rollout_ended()

    async def roles_started(self) -> None:
        """Wait until the open step's role windows have started (or ended without starting),
        those held for its rollout (``colocated``) included: after :meth:`rollout_ended`,
        so that the training that follows is captured from its first stage. Bounded (the
        stops it waits for, then a start); returns at once outside a step."""
        await self._steps.roles_started()

    def step(self, n: int) -> _Step:
        """The context of global step ``n`` (1-based): opens and closes that step's windows.

        Entering it raises ``StepError`` (a ``ValueError``) for a step that is not an
        integer >= 1, and ``UsageError`` before the profiler is open or inside another step.
        """
        return _Step(self, n)

    def capture(
        self,
        next: int | None = None,
        steps: str | Sequence[int] | None = None,
        *,
        replicas: Sequence[int] | None = None,
        roles: Sequence[str] | None = None,
        forward_steps: int | None = None,
    ) -> CaptureAnswer:
        """Capture the next ``next`` global steps (default 1), or the listed ``steps``
        (``"120,130-132"`` or a list), as if the config had selected them.

        ``replicas`` and ``roles`` narrow the targets (default: every replica with a target
        and every role the config captures; naming one kind leaves the other out);
        ``forward_steps`` bounds each rollout window. Returns the run's answer: what it will
        capture, what was selected already, or why it refused (a step begun already, an
        unknown replica or role). Raises ``ConfigError`` for a malformed argument and
        ``UsageError`` once the profiler is closed.
        """
        if self._status == "closed":
            raise UsageError("the profiler is closed")
        request = CaptureRequest.of(
            next, steps, replicas=replicas, roles=roles, forward_steps=forward_steps
        )
        return self._control.capture(request)

    async def flush(self) -> None:
        """Write the manifest, the run's status and the timeline recorded so far, and wait
        until they are on disk (at most ``timeouts.stop_s``).

        Every change and every step end writes them without waiting; call this before
        reading them back during the run, or now and then in a run without steps. Write
        errors are logged, never raised.
        """
        await self._timeline.write_now()
        if self._status == "open":
            self._control.write_status()
        await self._files.flush(self.config.timeouts.stop_s)

    async def __aenter__(self) -> Profiler:
        if self._status != "new":
            raise UsageError("a Profiler is opened once")
        try:
            self._layout.check_writable()
        except OSError as exc:
            raise ConfigError(
                "global_profiler.save_path",
                f"cannot write to {self._layout.root}: {exc.strerror or exc}",
            ) from None
        self._status = "open"
        self._files.open()
        try:
            await self._control.open()
            if self._otel is not None:
                endpoint = await self._otel.start()
                self._manifest.otel = OtelRecord(endpoint=endpoint)
                self._files.changed(None)
        except BaseException:
            await self.aclose()
            raise
        self._log.info(
            "profiler open",
            save_path=str(self._layout.root),
            steps=str(self.config.global_profiler.steps),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every open window and wait for all stops (bounded), then write the manifest."""
        if self._status != "open":
            self._status = "closed"
            return
        try:
            self._control.closing()
            self._steps.end_run()
            await wait(self._windows.tasks, self._windows.bound())
            await self._control.aclose()
            await self._serving.aclose()
            await self._targets.aclose()
        finally:
            if self._otel is not None:
                await self._otel.aclose()
            self._windows.abandon()
            self._status = "closed"
            try:
                await self._timeline.aclose()
                await self._serving.last_word()
            finally:
                # The run's last word: as long as a window may take to end, a slow disk too.
                await self._files.aclose(self._windows.bound())
                self._disk.shutdown(wait=False)
            counts: dict[str, int] = {}
            for record in self._manifest.windows:
                counts[record.state] = counts.get(record.state, 0) + 1
            self._log.info("profiler closed", windows=counts)

    # -- wiring -----------------------------------------------------------------------------

    async def _enter_step(self, n: int) -> None:
        if self._status != "open":
            raise UsageError("open the profiler first: `async with prof:`")
        if self._otel is not None:
            # Before the gate takes step n: requests sent while its windows start carry it.
            self._otel.step_began(n, time.time_ns())
        await self._steps.enter(n)


class _Step:
    """``async with prof.step(n):`` — see :meth:`Profiler.step`."""

    __slots__ = ("_n", "_prof")

    def __init__(self, prof: Profiler, n: int) -> None:
        self._prof = prof
        self._n = n

    async def __aenter__(self) -> int:
        await self._prof._enter_step(self._n)
        return self._n

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._prof._steps.leave(self._n, exc)


def _trace_salt() -> str:
    """The run's half of its W3C trace ids: random, never all zero (W3C forbids that id)."""
    while True:
        salt = secrets.token_hex(8)
        if int(salt, 16):
            return salt
