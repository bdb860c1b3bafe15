"""The driver's side: ``share(prof)`` starts the hub and keeps it and the profiler in step."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprof._core import BlockingProfiler, Profiler
from aprof._core.serving import Serving
from aprof._core.sharing import RolloutView
from aprof._errors import ConfigError, TargetError, UsageError, describe
from aprof._logging import logger
from aprof.ray._cluster import Cluster
from aprof.ray._hub import MAX_CALLS, Call, Decision, Hub, Mail

PULL_S = 10.0
"""The driver's pull of the hub's mail returns after this long without any."""

_RAY_NEEDED = "aprof.ray.share needs Ray: pip install 'aprof[ray]'"


@dataclass(frozen=True)
class ShareHandle:
    """What other Ray processes need to join a shared profiler: pass it to them (it pickles)
    and call :func:`aprof.ray.connect` there."""

    hub: Any
    """The hub actor's handle."""
    config: dict[str, Any]
    """The driver's resolved configuration."""
    save_path: str
    """The driver's ``save_path``: other processes write their timelines below it."""
    run_id: str
    """The driver's run, as its manifest names it."""
    trace_salt: str | None = None
    """The run's half of its W3C trace ids: other processes' requests join the run's traces."""


def share(prof: Profiler | BlockingProfiler) -> ShareHandle:
    """Share ``prof``, open (an async one: in its event loop), with other Ray processes.

    Starts the hub actor on this node; the driver's profiler stays the one owner of every
    window. Raises ``UsageError`` (a ``RuntimeError``) outside the profiler's event loop,
    before it is open or without ``ray.init()``; sharing again returns the same handle.
    """
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError as exc:
        raise ImportError(f"{_RAY_NEEDED} ({exc})") from exc
    if isinstance(prof, BlockingProfiler):  # shared from the loop it runs in
        return prof._open_portal().call(share, prof._profiler)
    serving = prof._serving
    if isinstance(serving.link, _DriverLink):
        return serving.link.handle
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise UsageError(
            "aprof.ray.share(prof) runs in the profiler's event loop, inside `async with prof:`"
        ) from None
    if prof._status != "open":
        raise UsageError("aprof.ray.share(prof): open the profiler first (`async with prof:`)")
    if not ray.is_initialized():
        raise UsageError("aprof.ray.share(prof): call ray.init() first")
    timeouts = prof.config.timeouts
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    hub = (
        ray.remote(Hub)
        .options(
            name=f"aprof-hub-{prof.run_id}",
            num_cpus=0,
            max_concurrency=MAX_CALLS,
            scheduling_strategy=here,
        )
        .remote(start_s=timeouts.start_s, connect_s=timeouts.connect_s)
    )
    handle = ShareHandle(
        hub=hub,
        config=prof.config.model_dump(mode="json"),
        save_path=str(prof.save_path),
        run_id=prof.run_id,
        trace_salt=prof.manifest.trace_salt,
    )
    return _DriverLink.started(serving, handle).handle


class _DriverLink:
    """The profiler's :class:`~aprof._core.sharing.Link` over the hub."""

    def __init__(self, serving: Serving, handle: ShareHandle) -> None:
        self.serving = serving
        self.handle = handle
        self.pulling: asyncio.Task[None] | None = None
        self._view = RolloutView(0, None, False, {})
        """The last view published."""
        self._gone: str | None = None
        """Why the hub cannot be reached (said once)."""
        self._closed: set[str] = set()
        """Processes that closed their remote profiler."""
        self._taken = 0
        """The number of the last mail taken from the hub: each pull says it."""
        self._closing = False
        """The profiler closes: views tell the processes to close, and the pull in flight
        is the last of the loop."""
        self._log = logger.bind(run_id=handle.run_id)
        self.cluster = Cluster(serving, Path(handle.save_path), handle.run_id)
        self._reported: set[str] = set()
        """Processes heard from: a new one's node has its clock measured."""
        self._publishing: asyncio.Handle | None = None
        """The view's publication, due at the end of this turn of the event loop."""

    @classmethod
    def started(cls, serving: Serving, handle: ShareHandle) -> _DriverLink:
        """``serving``'s link to the hub behind ``handle``, from now on: the view is sent and
        the pull of the hub's mail runs (in this event loop)."""
        link = cls(serving, handle)
        serving.link = link
        link.changed()
        link.cluster.measure_soon()
        link.pulling = asyncio.get_running_loop().create_task(link.pull(), name="aprof-hub-pull")
        return link

    def changed(self) -> None:
        """Publish the view as this turn of the event loop ends: what one turn changes (a
        window opened and started at once, the windows one pull's mail opened) reaches the
        processes as one view, not as a first view they act on and a second that comes
        only after their own busy turn."""
        if self._gone is None and self._publishing is None:
            self._publishing = asyncio.get_running_loop().call_soon(self._publish)

    def _publish_now(self) -> None:
        """Publish the view now if a change waits for it (before a call that needs the
        hub to have it)."""
        if self._publishing is not None:
            self._publishing.cancel()
            self._publish()

    def _publish(self) -> None:
        self._publishing = None
        if self._gone is not None:
            return
        view = self.serving.view(self._view.version + 1)
        if self._closing:  # a later view must not take back the close
            view = view._replace(closing=True)
        if view[1:] == self._view[1:]:  # the same as the last: nobody need hear it again
            return
        self._view = view
        # Not awaited: the hub takes views in version order whatever order they arrive in.
        try:
            self.handle.hub.publish.remote(view)
        except Exception as exc:  # called from the profiler's steps: never raise into them
            self._lost(exc)

    async def entered(self, step: int) -> None:
        if self._view.live:  # a step with rollout windows: the clocks its traces are read on
            self.cluster.measure_soon()
        if self._gone is not None:
            return
        self._publish_now()
        try:
            async with asyncio.timeout(self.serving.config.timeouts.connect_s + 1.0):
                late: list[str] = await self.handle.hub.entered.remote(self._view)
        except TimeoutError:  # slow (starting, say), not gone: the step goes on
            self._log.warning("aprof hub slow: step began before others knew it", step=step)
            return
        except Exception as exc:
            self._lost(exc)
            return
        for name in late:
            self.serving.note(
                step,
                None,
                f"{name} did not take step {step} within timeouts.connect_s: steps no longer "
                "wait for it until it answers again (it may be gone)",
                level="problem",
            )

    async def pull(self) -> None:
        """Take the hub's mail until the profiler closes: open the windows asked for, add
        the reports, decide the capture requests."""
        while not self._closing:
            try:
                async with asyncio.timeout(PULL_S + self.serving.config.timeouts.connect_s):
                    mails: list[Mail] = await self.handle.hub.pull.remote(PULL_S, self._taken)
            except TimeoutError:  # a slow hub (starting, say): the next pull gets this mail
                continue
            except Exception as exc:
                self._lost(exc)
                return
            self._deliver(mails)

    def _deliver(self, mails: list[Mail]) -> Any:
        """Act on ``mails``, here in the profiler's event loop; returns the hub call that
        carries the decisions on their calls (``None`` when they have none)."""
        decisions = self._take(mails)
        self._publish_now()  # what they changed, before the decisions on them
        if not decisions:
            return None
        try:  # not awaited: the pull goes on; a process that gave up meanwhile has its error
            return self.handle.hub.decided.remote(decisions)
        except Exception as exc:
            self._lost(exc)
            return None

    def _take(self, mails: list[Mail]) -> dict[int, Decision]:
        """Open the windows asked for, add the reports, decide the calls."""
        decisions: dict[int, Decision] = {}
        for mail in mails:
            if mail.number <= self._taken:
                continue  # taken from an earlier pull's answer: reports count once
            for step, replica in mail.asks:
                self.serving.open_for(step, replica)
            if not set(mail.reports) <= self._reported:
                self._reported |= set(mail.reports)
                self.cluster.measure_soon()
            for name, report in mail.reports.items():
                try:
                    self.serving.take_report(name, report)
                except Exception as exc:  # a report that does not parse costs itself only
                    self._log.warning("report not taken", process=name, error=describe(exc))
                if report.closed:
                    self._closed.add(name)
            decisions.update((number, self._decide(call)) for number, call in mail.calls.items())
            self._taken = mail.number
        return decisions

    def _decide(self, call: Call) -> Decision:
        """The driver's decision on another process's call: the profiler's own, as
        ``prof.capture(...)``, ``prof.add_target(...)`` or ``prof.remove_target(...)``; none
        once it closes (the steps have ended)."""
        if self._closing:
            return Decision(error="the driver's profiler is closing")
        try:
            if call.op == "capture":
                return Decision(answer=self.serving.capture(call.payload))
            self.serving.change_target(call.op, call.payload)
            return Decision(answer={})
        except ConfigError as exc:
            return Decision(malformed=(exc.key, exc.reason))
        except (TargetError, TypeError) as exc:  # what add_target and remove_target refuse
            return Decision(refused=str(exc))
        except Exception as exc:  # never into the pull: the others' mail goes on
            self._log.warning("call not carried out", op=call.op, error=describe(exc))
            return Decision(error=f"the driver could not carry it out: {describe(exc)}")

    async def aclose(self) -> None:
        self._closing = True
        hub = self.handle.hub
        if self._gone is None:
            await self._close_processes()
        try:
            # The pull in flight returns at the wake; cancelled only when the hub is slow
            # (what it took, the last pull below takes again).
            async with asyncio.timeout(self.serving.config.timeouts.connect_s + 1.0):
                if self._gone is None:
                    await hub.wake.remote()
                if self.pulling is not None:
                    await asyncio.shield(self.pulling)
        except Exception as exc:
            self._lost(exc)
        if self.pulling is not None:
            self.pulling.cancel()
        if self._gone is not None:
            _kill(hub)
            return
        try:
            async with asyncio.timeout(self.serving.config.timeouts.connect_s + 1.0):
                processes: dict[str, str] = await hub.processes.remote()
                decided = self._deliver(await hub.pull.remote(0.0, self._taken))
                if decided is not None:  # before the hub ends: those waiting hear why
                    await decided
        except Exception as exc:
            self._lost(exc)
            return
        finally:
            self._gone = "the profiler closed"
            _kill(hub)
        for name, state in processes.items():
            if state != "closed" and name not in self._closed:
                self.serving.note(
                    None,
                    None,
                    f"{name} did not close its remote profiler ({state}): what it counted "
                    "after its last report is not in the windows",
                    level="problem",
                )

    async def last_word(self) -> None:
        await self.cluster.last_word()

    async def _close_processes(self) -> None:
        """Tell the processes that the run closes and wait, at most ``timeouts.connect_s``,
        for each that watches to close its remote profiler (those that do not are noted)."""
        connect_s = self.serving.config.timeouts.connect_s
        self.changed()  # a closing view: each process's watch returns with it at once
        self._publish_now()
        try:
            async with asyncio.timeout(connect_s + 1.0):
                await self.handle.hub.closed.remote(connect_s)
        except TimeoutError:  # a slow hub: what has not come in by now is noted
            self._log.warning("aprof hub slow: closed before the processes did")
        except Exception as exc:
            self._lost(exc)

    def _lost(self, exc: BaseException) -> None:
        if self._gone is not None:
            return
        self._gone = describe(exc)
        self._log.warning("aprof hub lost", error=self._gone)
        self.serving.note(
            self.serving.current_step,
            None,
            f"the hub shared with other processes is gone ({self._gone}): their requests "
            "are no longer gated or counted",
            level="problem",
        )


def _kill(hub: Any) -> None:
    """End the hub: the processes still connected go on ungated and uncounted."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(hub)
