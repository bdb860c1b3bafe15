"""The run's side of deciding at run time: capture requests from the control folder (read at
each step boundary), from ``prof.capture`` and the HTTP endpoint, and from the triggers, each
decided by the :class:`~aprof._core.plan.Plan`; their answers and the run's status written
below ``save_path/control/``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections import deque
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Final, Literal

import structlog

from aprof._config import ProfilerConfig
from aprof._control import (
    CaptureAnswer,
    CaptureRequest,
    ControlFolder,
    Incoming,
    RequestedBy,
    RunStatus,
    WindowStatus,
    refusal,
)
from aprof._control.folder import FolderRead
from aprof._control.status import MAX_LISTED, RECENT_WINDOWS
from aprof._core.disk_guard import DiskGuard
from aprof._core.plan import Plan
from aprof._core.triggers import SlowTrigger
from aprof._core.window_machine import Phase, WindowRun
from aprof._core.windows import Windows
from aprof._errors import describe
from aprof._layout import OutputLayout
from aprof._manifest import ManifestFiles

if TYPE_CHECKING:
    from aprof._control.http import ControlEndpoint

STATUS_AFTER_S: Final = 0.2
"""Window moves within this long are one status write."""
PROBLEMS: Final = 20
"""Problems a status lists, newest last."""
SHOWN_ASIDE: Final = 5
"""Entries named when a read sets some aside."""
ENDPOINT_KEY: Final = ("control", "endpoint.json")
"""Where the endpoint's address is written, below ``save_path``: ``{"address": ...}``."""


class Control:
    """Capture requests and triggers of one run, and its status."""

    def __init__(
        self,
        config: ProfilerConfig,
        *,
        plan: Plan,
        files: ManifestFiles,
        layout: OutputLayout,
        run_id: str,
        disk: Executor,
        windows: Windows,
        guard: DiskGuard,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._config = config
        self._plan = plan
        self._files = files
        self._folder = ControlFolder(layout.root)
        self._run_id = run_id
        self._disk = disk
        self._windows = windows
        windows.listen(self._window_moved)
        self._guard = guard
        self._note = windows.note
        self._log = log
        self._host = socket.gethostname()
        triggers = config.triggers
        self.slow_step = (
            None if triggers.slow_step is None else SlowTrigger("slow_step", triggers.slow_step)
        )
        self.slow_rollout = (
            None
            if triggers.slow_rollout is None
            else SlowTrigger("slow_rollout", triggers.slow_rollout)
        )
        self.http: str | None = None
        """The endpoint's address once it listens."""
        self._endpoint: ControlEndpoint | None = None
        self._recent: deque[WindowStatus] = deque(maxlen=RECENT_WINDOWS)
        self._problems: deque[str] = deque(maxlen=PROBLEMS)
        self._step: int | None = None
        self._last_step: int | None = None
        self._began_ns: int | None = None
        self._boundary_s: float | None = None
        self._longest_s = 0.0
        self._state: Literal["running", "ended"] = "running"
        self._status_due = False
        self._folder_failing = False
        self._closing = False
        self._reading: Future[FolderRead] | None = None
        """The control folder's read under way."""
        self._found: list[Incoming] = []
        """Requests read and not decided yet."""

    # -- the HTTP endpoint -----------------------------------------------------------------

    async def open(self) -> None:
        """Read the control folder for the first step; start the HTTP endpoint when
        ``control.http`` asks for one, and say where it listens (``control/endpoint.json``,
        the status). A port that cannot be bound is a problem of the status, and the run
        goes on without the endpoint; raises ``ConfigError`` when the token file cannot be
        read or holds no usable token."""
        self.read_folder()
        config = self._config.control.http
        if config is None:
            self.write_status()
            return
        from aprof._control.http import ControlEndpoint  # aiohttp's server: only when asked

        endpoint = ControlEndpoint(
            config,
            decide=self.capture,
            status=self.status,
            timeout_s=self._config.timeouts.connect_s,
        )
        try:
            address = await endpoint.start()
        except OSError as exc:
            self._problem(
                f"the control endpoint cannot listen on 127.0.0.1:{config.port}: {describe(exc)}"
            )
        else:
            self._endpoint = endpoint
            self.http = address
            data = json.dumps({"address": address}).encode()
            self._files.put(ENDPOINT_KEY, data)
            self._log.info("control endpoint", address=address)
        self.write_status()

    async def aclose(self) -> None:
        """The run closes: requests read and not decided are refused (none is lost without
        an answer), the last status says it ended, and the HTTP endpoint stops (bounded; a
        failure is logged, never raised)."""
        reading = self._reading
        if reading is not None:
            with contextlib.suppress(Exception):  # its error is the folder's, said already
                await asyncio.wait_for(
                    asyncio.shield(asyncio.wrap_future(reading)),
                    self._config.timeouts.connect_s,
                )
        self._collect()
        self._disk.submit(self._folder.close)  # after any read still under way
        found, self._found = self._found, []
        self._state = "ended"
        self._step = None
        self._closing = True
        for item in found:
            self._take(item)  # refused: the run is closing
        self.write_status()
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is None:
            return
        try:
            await endpoint.aclose()
        except Exception as exc:
            self._log.warning("control endpoint did not close cleanly", error=describe(exc))

    # -- requests --------------------------------------------------------------------------

    def capture(
        self, request: CaptureRequest, requested_by: RequestedBy = "on_demand"
    ) -> CaptureAnswer:
        """Decide ``request`` now (a person's, unless a trigger's), write its answer and tell
        the log."""
        if self._closing:
            why = "the run is closing: no step begins any more"
            first = self._plan.first_free
            return self._answered(
                refusal(request.id, why, requested_by=requested_by, decided_at=first)
            )
        return self._answered(self._plan.decide(request, requested_by))

    def closing(self) -> None:
        """The run closes: requests decided from now on are refused."""
        self._closing = True

    def read_folder(self) -> None:
        """Have the control folder read off the event loop (a few files, bounded) unless a
        read is under way or found requests not decided yet; what it finds is decided at the
        next boundary. No wait."""
        if not self._config.control.enable:
            return
        self._collect()
        if self._reading is None and not self._found:
            # A thread's future, not the loop's: it is done when the thread is, even in a
            # run whose steps never yield to the event loop.
            self._reading = self._disk.submit(self._folder.take)

    def boundary(self) -> None:
        """A step is about to begin: decide the requests read so far (a read not finished
        yet is decided at a later boundary), and read again."""
        now = time.monotonic()
        if self._boundary_s is not None:
            self._longest_s = max(self._longest_s, now - self._boundary_s)
        self._boundary_s = now
        self._collect()
        found, self._found = self._found, []
        for item in found:
            self._take(item)
        self.read_folder()

    def _collect(self) -> None:
        """Keep what a finished read found, and tell what it set aside (each entry once: it
        is gone from the folder, or remembered as stuck)."""
        reading = self._reading
        if reading is None or not reading.done():
            return
        self._reading = None
        try:
            read = reading.result()
        except Exception as exc:  # the folder's trouble is the run's status, never its error
            if not self._folder_failing:
                self._problem(f"the control folder cannot be read: {describe(exc)}")
            self._folder_failing = True
            return
        self._folder_failing = False
        self._found.extend(read.incoming)
        if read.set_aside:
            self._log.warning(
                "control entries set aside",
                to="control/rejected/",
                count=len(read.set_aside),
                first=read.set_aside[:SHOWN_ASIDE],
            )
        if read.stuck:
            self._problem(
                f"{len(read.stuck)} entries of control/requests/ can be neither read nor moved "
                f"(left there, not looked at again): {'; '.join(read.stuck[:SHOWN_ASIDE])}"
            )

    def _take(self, item: Incoming) -> None:
        if item.request is None:
            answer = refusal(item.id, item.error or "unreadable", decided_at=self._plan.first_free)
            self._answered(answer)
        else:
            self.capture(item.request)

    def _answered(self, answer: CaptureAnswer) -> CaptureAnswer:
        answer = answer.model_copy(update={"run_id": self._run_id})
        data = answer.model_dump_json(by_alias=True, indent=1).encode()
        self._files.put(ControlFolder.answer_key(answer), data)
        if answer.accepted:
            self._log.info(
                "capture accepted",
                id=answer.id,
                requested_by=answer.requested_by,
                steps=answer.steps,
                targets=answer.targets,
            )
            self._note(None, None, f"{answer.requested_by} capture {answer.id}: {answer.line()}")
        else:
            self._log.warning("capture refused", id=answer.id, reason=answer.reason)
        self.write_status()
        return answer

    # -- triggers --------------------------------------------------------------------------

    def step_ended(self, n: int, wall_s: float, rollout_s: float | None, *, profiled: bool) -> None:
        """Step ``n`` ended normally after ``wall_s`` (its requests spanning ``rollout_s``):
        let the triggers measure it, and ask for what they fire."""
        self._step = None
        for trigger, seconds in ((self.slow_step, wall_s), (self.slow_rollout, rollout_s)):
            if trigger is None:
                continue
            why = trigger.observe(n, seconds, profiled=profiled)
            if why is None:
                continue
            self._log.warning("trigger fired", trigger=trigger.name, why=why)
            self._note(n, None, why)
            self.capture(CaptureRequest(next=trigger.config.capture), trigger.name)
        self.changed()

    def step_began(self, n: int) -> None:
        """Step ``n`` has begun (its windows opened)."""
        self._step = self._last_step = n
        self._began_ns = time.time_ns()
        self.changed()

    # -- status ----------------------------------------------------------------------------

    def _window_moved(self, run: WindowRun, phase: Phase) -> None:
        """A window moved: the status shows it; one that ended is listed among the recent."""
        if not phase.final:
            self.changed()
            return
        self._recent.append(_window_status(run))
        if run.phase in (Phase.FAILED, Phase.TIMEOUT):  # on the log already
            self._problems.append(
                f"step {run.window.step}, {run.window.target}: {run.phase.value}: "
                f"{run.record.error or 'no error text'}"
            )
        self.changed()

    def changed(self) -> None:
        """Something the status shows moved: write it soon (moves close together, once)."""
        if not self._status_due:
            self._status_due = True
            asyncio.get_running_loop().call_later(STATUS_AFTER_S, self.write_status)

    def _problem(self, text: str) -> None:
        self._log.warning("control", problem=text)
        self._problems.append(text)

    def status(self) -> RunStatus:
        """The run as ``aprof status`` shows it."""
        problems = list(self._problems)
        error = self._guard.error
        if error is not None:
            problems.append(f"no capture starts: the manifest cannot be written ({error})")
        triggers = [t.status() for t in (self.slow_step, self.slow_rollout) if t is not None]
        return RunStatus(
            run_id=self._run_id,
            pid=os.getpid(),
            host=self._host,
            state=self._state,
            updated_ns=time.time_ns(),
            step=self._step,
            step_began_ns=self._began_ns if self._step is not None else None,
            last_step=self._last_step,
            longest_step_s=self._longest_s,
            windows=[_window_status(run) for run in list(self._windows.live.values())[:MAX_LISTED]],
            recent=list(self._recent),
            planned=self._plan.planned()[:MAX_LISTED],
            config_steps=str(self._config.global_profiler.steps),
            triggers=triggers,
            problems=problems,
            http=self.http,
            folder=self._config.control.enable,
        )

    def write_status(self) -> None:
        """Hand the status to the writer now."""
        self._status_due = False
        data = self.status().model_dump_json(by_alias=True, indent=1).encode()
        self._files.put(ControlFolder.status_key(), data)


def _window_status(run: WindowRun) -> WindowStatus:
    record = run.record
    return WindowStatus(
        step=record.step,
        target=record.target,
        kind=record.kind,
        phase=run.phase.value,
        requested_by=record.requested_by,
        forward_steps=record.forward_steps.observed,
        error=record.error,
    )
