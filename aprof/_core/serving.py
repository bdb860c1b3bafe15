"""The side of sharing that serves other processes: what the driver's profiler shows them, the
windows they ask it to open, and what they report back.

The transport (``aprof.ray``) is a :class:`~aprof._core.sharing.Link`: told when the view
changed, waited for as a step begins, and calling back :meth:`Serving.view`,
:meth:`Serving.open_for`, :meth:`Serving.take_report`, :meth:`Serving.capture` and
:meth:`Serving.change_target` with what the other processes send. A worker group's ranks hand
their timelines over through their target's machine (:meth:`Serving.take_timeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import structlog

from aprof._capture import WorkerTimeline
from aprof._config import ProfilerConfig
from aprof._control import CaptureAnswer, CaptureRequest
from aprof._core.accounting import LiveAccounting
from aprof._core.admission import Admission
from aprof._core.sharing import Link, RemotePhase, Report, RolloutView
from aprof._core.targets import Targets
from aprof._core.window_machine import Phase, WindowRun, add_counts, shared_phase
from aprof._core.windows import Windows
from aprof._errors import describe
from aprof._manifest import HostClock, HostFile, ManifestFiles, NoteLevel, TimelineFile
from aprof.abc import CaptureTarget


class Serving:
    """The driver's profiler as other processes reach it, through :attr:`link` when shared."""

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        targets: Targets,
        windows: Windows,
        admission: Admission,
        files: ManifestFiles,
        decide: Callable[[CaptureRequest], CaptureAnswer],
        add_target: Callable[[CaptureTarget], None],
        remove_target: Callable[[str], None],
        accounting: LiveAccounting,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.config = config
        self._targets = targets
        self._windows = windows
        self._admission = admission
        self._files = files
        self._decide = decide
        self._add_target = add_target
        self._remove_target = remove_target
        self._accounting = accounting
        self._log = log
        self.link: Link | None = None
        """The transport to the other processes, once the profiler is shared."""
        windows.listen(self._window_moved)

    @property
    def current_step(self) -> int | None:
        """The global step now open, if any."""
        return self._admission.gate.step

    def _window_moved(self, run: WindowRun, phase: Phase) -> None:
        if run.window.kind == "rollout":  # the other processes see the rollout's phases
            self.changed()

    def changed(self) -> None:
        """The view changed: tell the other processes (no wait)."""
        if self.link is not None:
            self.link.changed()

    async def entered(self, step: int) -> None:
        """Step ``step`` is open: return once the other processes know it (bounded)."""
        if self.link is not None:
            await self.link.entered(step)

    async def aclose(self) -> None:
        """The profiler closes: have the other processes close and take their last reports."""
        if self.link is not None:
            await self.link.aclose()

    async def last_word(self) -> None:
        """The profiler's own files are written: the transport's last word on the run's files
        and hosts (bounded)."""
        if self.link is not None:
            await self.link.last_word()

    def hosts_and_files(
        self, hosts: list[HostClock], files: list[HostFile] | None, notes: list[str]
    ) -> None:
        """Each host's clock, and (when listed) every file of the run on every host."""
        self._files.hosts_and_files(hosts, files)
        for text in notes:
            self.note(None, None, text, level="problem")

    def listed_files(self) -> list[HostFile]:
        """The run's files on every host, as listed last."""
        return list(self._files.manifest.files)

    def view(self, version: int) -> RolloutView:
        """The open step and where each selected replica's window of it stands."""
        gate = self._admission.gate
        phases: dict[int, RemotePhase] = {}
        if gate.live:
            due = self.config.rollout.start == "on_first_request"
            for replica in sorted(self._admission.replicas):
                run = self._admission.windows.get(replica)
                if run is not None:
                    phases[replica] = shared_phase(run)
                elif due:
                    phases[replica] = "due"
        return RolloutView(version, gate.step, gate.live, phases)

    def open_for(self, step: int, replica: int) -> None:
        """Another process's first request of ``step`` to ``replica``: open its window if it
        is due (as a request of this process would), and tell the others where it stands."""
        run = self._admission.open_for(step, replica)
        # A window that starts tells the others itself (its move); else tell them here.
        if run is None or run.phase is not Phase.STARTING:
            self.changed()

    def capture(self, fields: dict[str, object]) -> dict[str, object]:
        """Another process's ``capture(...)``: the driver decides it as its own; the answer as
        plain JSON fields (``ConfigError`` for a malformed request, raised there)."""
        answer = self._decide(CaptureRequest.parse(fields))
        return answer.model_dump(mode="json", by_alias=True)

    def change_target(self, op: Literal["add_target", "remove_target"], payload: object) -> None:
        """Another process's ``add_target(target)`` or ``remove_target(name)``: the driver's
        own (raising there as here: ``add_target`` refuses what is no target)."""
        if op == "add_target":
            self._add_target(cast("CaptureTarget", payload))
        else:
            if not isinstance(payload, str):
                raise TypeError(f"a target name is a string, got {payload!r}")
            self._remove_target(payload)

    def take_report(self, process: str, report: Report) -> None:
        """Add what ``process`` counted to its windows, list its timeline files, and take
        its timeline's ledger into the accounting."""
        self._accounting.take(report.ledger, process)
        for c in report.counts:
            machine = self._targets.by_replica.get(c.replica)
            if machine is None:
                continue
            target = machine.target.name
            run = self._windows.live.get((c.step, target))
            if run is not None:
                run.add_counts(c.admitted, c.gated)
                self._files.changed(c.step)
            elif (record := self._files.window(c.step, target)) is not None:
                add_counts(record, c.admitted, c.gated)
                self._files.changed(c.step)
            elif c.admitted:
                self.note(
                    c.step,
                    target,
                    f"{process}: {c.admitted} request(s) reported too late to count",
                    level="problem",
                )
            if c.ungated:
                self.note(
                    c.step,
                    target,
                    f"{process}: {c.ungated} request(s) went ahead ungated and uncounted: the "
                    f"driver did not answer within timeouts.start_s",
                    level="problem",
                )
        if report.timeline:
            files = [TimelineFile.model_validate(e) for e in report.timeline]
            self._files.list_timeline(files, process=process)

    def take_timeline(self, found: WorkerTimeline) -> None:
        """A worker rank's timeline, as its target's machine hands it over: list its files and
        take its ledger into the accounting (one that cannot be taken is logged)."""
        try:
            self.take_report(found.process, Report(timeline=list(found.files), ledger=found.ledger))
        except Exception as exc:  # a rank's malformed hand-over costs its own listing only
            self._log.warning(
                "worker timeline not taken", process=found.process, error=describe(exc)
            )

    def note(
        self, step: int | None, target: str | None, text: str, *, level: NoteLevel = "info"
    ) -> None:
        """Write down something about the processes the profiler is shared with:
        information, unless ``level`` says it is a problem."""
        self._windows.note(step, target, text, level=level)
