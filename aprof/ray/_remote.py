"""Any other process's side: ``connect(handle)`` gives a profiler that gates, counts and
records through the driver's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from aprof._config import ProfilerConfig, load_config
from aprof._control import CaptureAnswer, CaptureRequest
from aprof._core.process_timeline import Recording, open_timeline
from aprof._core.sharing import Counts, Report, RolloutView
from aprof._errors import ConfigError, TargetError, UsageError, describe
from aprof._layout import check_name
from aprof._logging import logger
from aprof._timeline.events import SPAN, now_ns
from aprof._timeline.recorder import Gate, Request, Tally
from aprof.abc import CaptureTarget
from aprof.ray._hub import WATCH_S, Answer, Call, Decision
from aprof.ray._share import ShareHandle

_ASKING = ("due", "starting")
"""Phases in which a process asks the driver before its first request goes."""
_UNKNOWN: tuple[str | None, int] = ("", -1)
"""What :attr:`RemoteProfiler._known` holds for a window no ask has settled."""
_KNOWN: dict[Answer, str] = {"active": "active", "started": "active", "failed": "go", "go": "go"}
"""What an answer says of the step's later requests: admit them locally, or let them go."""
JOIN_S = 60.0
"""How long ``connect`` waits for the hub: workers are often made together with the hub,
which, like any Ray actor, may take seconds to start on a busy node."""
UNGATED = "aprof: requests ungated"
"""The timeline span of an ask the driver did not answer: the requests of its step and
replica go ungated and uncounted (the span's note says why)."""


def connect(
    handle: ShareHandle, *, role: str = "agent_loop_worker", rank: int | None = None
) -> RemoteProfiler:
    """Join the driver's profiler behind ``handle`` from this Ray process.

    The process is named ``<role>_<rank>`` (the hub picks the next free rank if none is
    given); its timeline is ``timeline/<name>.trace.json.gz`` below the driver's
    ``save_path``. Call it in an async actor's constructor (which runs in the actor's event
    loop) or inside the event loop the requests run in. A hub that cannot be reached within
    ``JOIN_S`` (60 s, or ``timeouts.connect_s`` if longer) leaves a profiler whose requests go
    ungated and uncounted.
    """
    if not isinstance(handle, ShareHandle):
        raise TypeError(f"connect() takes aprof.ray.share(prof)'s handle, not {handle!r}")
    check_name(role, "role")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise ValueError(f"rank must be an integer >= 0 or None, got {rank!r}")
    config = load_config(handle.config)
    gone: str | None = None
    try:
        # Not ray.get: this may run in an async actor's loop, where Ray warns about that.
        joined = handle.hub.register.remote(role, rank).future()
        name, view = joined.result(timeout=max(JOIN_S, config.timeouts.connect_s))
    except Exception as exc:  # the hub is gone or slow: this process goes on alone
        gone = describe(exc)
        name = f"{role}_{rank}" if rank is not None else f"{role}-{os.getpid()}"
        view = RolloutView(0, None, False, {})
        logger.warning("aprof hub not reached", process=name, error=gone)
    return RemoteProfiler(handle, config, name, view, gone)


class RemoteProfiler(Recording):
    """The driver's profiler as one other process sees it: :meth:`request`, :meth:`span` and
    :attr:`current_step`, as on :class:`aprof.Profiler`, and :meth:`capture`,
    :meth:`add_target` and :meth:`remove_target`, which the driver carries out; :meth:`aclose`
    at the end (the driver's profiler closing has it run if the process does not).

    A request's first to a replica in a step asks the driver (one round trip, shared by the
    requests that come meanwhile); after that, its requests to that replica in that step are
    admitted locally. A request that would wait first reads what Ray has already delivered
    and the event loop has not run yet (the ask's answer, a newer view): in a busy loop the
    rest of a wave of requests goes ahead once the answer is here, not after the wave. Counts
    and timeline files reach the driver with the next watch.
    """

    def __init__(
        self,
        handle: ShareHandle,
        config: ProfilerConfig,
        name: str,
        view: RolloutView,
        gone: str | None,
    ) -> None:
        self.name = name
        """This process's name: its timeline's file name and its name in the driver's notes."""
        self.config = config
        self._hub = handle.hub
        self._gone = gone
        """Why the hub cannot be reached, if it cannot."""
        self._gate = Gate(self._admit)
        self._gate.trace_salt = handle.trace_salt
        self._view = RolloutView(-1, None, False, {})
        self._known: dict[tuple[int, int], tuple[str | None, int]] = {}
        """What asks settled, with the version of the view the answer was read from (one
        no older than the view held): ``active`` (admit locally) or ``go`` (let go
        uncounted); ``None``: the driver did not answer in time, the rest go ungated."""
        self._waiting: dict[tuple[int, int], list[tuple[Request, asyncio.Future[Request]]]] = {}
        """The requests waiting for each ask that is out."""
        self._answers: dict[tuple[int, int], concurrent.futures.Future[Any]] = {}
        """Each ask that is out, as Ray delivers its answer (from its own thread)."""
        self._heard: concurrent.futures.Future[Any] | None = None
        """The watch in flight, as Ray delivers the view it returns."""
        self._asks: set[asyncio.Task[None]] = set()
        self._counts: dict[tuple[int, int], list[int]] = {}
        """Per (step, replica): admitted, gated, ungated, since the last report."""
        self._tallies: dict[tuple[int, int], Tally] = {}
        """Per (step, replica) known active: the requests the gate admitted itself (in C where
        it is), since the last report."""
        self._sent_timeline: list[dict[str, object]] = []
        self._watching: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        """The close, begun by :meth:`aclose` or by the driver's closing view."""
        self._timeline = open_timeline(
            self.config.timeline, root=Path(handle.save_path), process=self.name
        )
        self._recorder = self._timeline.recorder
        self._apply(view)
        self._watch()

    @property
    def current_step(self) -> int | None:
        """The driver's open step, as this process last heard (one hub message behind it at
        most; a step does not begin before every watching process has it)."""
        self._watch()
        return self._gate.step

    def request(self, *, replica: int, request_id: str | None = None) -> Request:
        """The context of one request to ``replica``, as :meth:`aprof.Profiler.request`."""
        self._watch()
        return Request(self._gate, self._recorder, replica, request_id)

    async def capture(
        self,
        next: int | None = None,
        steps: str | Sequence[int] | None = None,
        *,
        replicas: Sequence[int] | None = None,
        roles: Sequence[str] | None = None,
        forward_steps: int | None = None,
    ) -> CaptureAnswer:
        """Ask the driver to capture the next ``next`` global steps (default 1), or the listed
        ``steps``, as :meth:`aprof.Profiler.capture` does there: the driver decides, against
        the first step it has not begun, and its answer comes back (accepted, or refused and
        why).

        Raises ``ConfigError`` for a malformed argument (checked here first, nothing is sent)
        and ``UsageError`` when there is no decision: this profiler or the driver's is
        closed, the hub cannot be reached, or no answer came within ``timeouts.connect_s``
        (the message says whether the driver may still carry it out; its answer would be
        ``control/answers/<id>.json`` below ``save_path``).
        """
        request = CaptureRequest.of(
            next, steps, replicas=replicas, roles=roles, forward_steps=forward_steps
        )
        fields = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        about = f"capture request {request.id} ({request.describe()})"
        decision = await self._call(Call("capture", fields), about)
        assert decision.answer is not None  # else _call raised
        return CaptureAnswer.model_validate(decision.answer)

    async def add_target(self, target: CaptureTarget) -> None:
        """Register ``target`` with the driver's profiler, as :meth:`aprof.Profiler.add_target`
        there: it is pickled to the driver, whose profiler drives its windows (a process that
        runs or finds servers adds them for the driver). Raises ``TargetError`` as the
        driver's would, ``UsageError`` as :meth:`capture` when no answer comes."""
        await self._call(Call("add_target", target), f"add_target({target.name!r})")

    async def remove_target(self, name: str) -> None:
        """Unregister the driver's target ``name``, as :meth:`aprof.Profiler.remove_target`
        there. Raises ``TargetError`` as the driver's would (no such target), ``UsageError``
        as :meth:`capture` when no answer comes."""
        await self._call(Call("remove_target", name), f"remove_target({name!r})")

    async def _call(self, call: Call, about: str) -> Decision:
        """``call`` carried out by the driver, through the hub; raises what it refused."""
        self._watch()
        if self._closing is not None:
            raise UsageError(f"{about}: this process's remote profiler is closed")
        if self._view.closing:
            raise UsageError(f"{about}: the driver's profiler is closing")
        if self._gone is not None:
            raise UsageError(f"{about}: the driver's profiler cannot be reached ({self._gone})")
        try:
            # The hub waits connect_s for the driver; this, a little longer for the hub.
            async with asyncio.timeout(self.config.timeouts.connect_s + 1.0):
                decision: Decision = await self._hub.call.remote(call)
        except TimeoutError:
            raise UsageError(
                f"{about}: the hub did not answer within timeouts.connect_s + 1 s; the driver "
                "may still carry it out"
            ) from None
        except Exception as exc:
            raise UsageError(f"{about}: the hub cannot be reached ({describe(exc)})") from None
        if decision.malformed is not None:
            raise ConfigError(*decision.malformed)
        if decision.refused is not None:
            raise TargetError(decision.refused)
        if decision.answer is None:
            raise UsageError(f"{about}: {decision.error or 'no decision'}")
        return decision

    async def aclose(self) -> None:
        """Write this process's timeline and hand its last counts and files to the driver
        (at most ``timeouts.connect_s`` for the hub, ``timeouts.stop_s`` for the disk).

        The driver's profiler closing does this by itself; later requests go ungated and
        uncounted."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())
        # Shielded: a caller cancelled does not cut the close short (it has one chance).
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        """What :meth:`aclose` does, once."""
        self._gate.live = False  # requests from now on go uncounted: no report would carry them
        if self._watching is not None:
            self._watching.cancel()
            await asyncio.wait({self._watching})  # its report is with the hub, or comes next
        try:
            async with asyncio.timeout(self.config.timeouts.stop_s):
                await self._timeline.aclose()
        except TimeoutError:  # a slow disk: the write goes on in its thread
            logger.warning("timeline not written in time", process=self.name)
        report = self._report()
        if self._gone is not None:
            return
        try:
            async with asyncio.timeout(self.config.timeouts.connect_s):
                await self._hub.close.remote(self.name, report)
        except Exception as exc:
            logger.warning("last report lost", process=self.name, error=describe(exc))

    # -- admitting requests ---------------------------------------------------------------------

    def _admit(self, req: Request) -> Awaitable[Request] | None:
        view, step = self._view, req.step
        if step is None or step != view.step:  # the gate is live only within a step
            return None
        key, phase = (step, req.replica), view.phases.get(req.replica)
        known = self._known.get(key, _UNKNOWN)[0] if phase in _ASKING else ""
        if phase in _ASKING and known == "" and self._caught_up(key):
            return self._admit(req)  # news that settles it (each is taken once)
        if phase == "active" or known == "active":  # the fast path: no round trip
            self._tally(key).admitted += 1  # as the gate counts it, for a replica not an int
            req.captured = True
            return None
        if phase not in _ASKING or known == "go":
            return None
        if known is None:  # the driver did not answer this step's ask in time
            self._counts.setdefault(key, [0, 0, 0])[2] += 1
            return None
        return self._wait_for_ask(req, key)

    def _wait_for_ask(self, req: Request, key: tuple[int, int]) -> asyncio.Future[Request]:
        """What ``req`` awaits: the answer to this process's ask for ``key``, asked now if
        no ask is out. One plain future per request: thousands wait at once in a busy loop."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = []
            # Sent now, not when the task first runs: that is after every coroutine already
            # scheduled has come to this gate.
            sent = None
            if self._gone is None:
                sent = self._answers[key] = self._hub.ask.remote(*key).future()
            asking = loop.create_task(self._ask(key, sent))
            self._asks.add(asking)
            asking.add_done_callback(self._asks.discard)
        answered: asyncio.Future[Request] = loop.create_future()
        answered.add_done_callback(_end_if_cancelled(req))  # no __aexit__ follows
        waiting.append((req, answered))
        return answered

    async def _ask(self, key: tuple[int, int], sent: concurrent.futures.Future[Any] | None) -> None:
        """Wait for the driver's answer for ``key`` (asked by the hub call ``sent``), at
        most ``timeouts.start_s``, and let the requests waiting for it go, unless a request
        took the answer first (:meth:`_caught_up`)."""
        answer: Answer | None = None
        version, began = self._view.version, now_ns()
        try:
            if sent is not None:
                async with asyncio.timeout(self.config.timeouts.start_s):
                    answer, version = await asyncio.wrap_future(sent)
        except TimeoutError:
            logger.warning("driver did not answer in time", process=self.name, step=key[0])
            self._mark(began, key, "no answer within timeouts.start_s")
        except Exception as exc:
            self._lost(exc)
            self._mark(began, key, f"hub gone: {self._gone}")
        finally:  # cancelled too (the loop closing): nobody is left waiting
            self._settle(key, answer, version)

    def _caught_up(self, key: tuple[int, int]) -> bool:
        """Take what Ray has delivered and the event loop has not run yet: the answer to
        the ask for ``key``, a newer view. Whether either changed what this process knows."""
        news = False
        heard = self._heard
        if _delivered(heard):
            self._heard = None  # the watch applies it again as it resumes: a no-op then
            news = self._apply(heard.result())
        sent = self._answers.get(key)
        if _delivered(sent):
            answer, version = sent.result()
            news = self._settle(key, answer, version) or news
        return news

    def _settle(self, key: tuple[int, int], answer: Answer | None, version: int) -> bool:
        """The ask for ``key`` is answered (``None``: not in time): let its requests go and
        keep what it says for the rest of the step; ``False`` if it was settled already."""
        self._answers.pop(key, None)
        if key not in self._waiting:
            return False
        self._release(key, answer)
        if key[0] == self._view.step and version >= self._view.version:
            known = None if answer is None else _KNOWN[answer]
            self._known[key] = (known, version)
            if known == "active":
                self._gate.active[key[1]] = self._tally(key)
        return True

    def _release(self, key: tuple[int, int], answer: Answer | None) -> None:
        """Count the requests waiting for ``key`` as ``answer`` says and let them go."""
        gated, captured = answer in ("started", "failed"), answer in ("active", "started")
        # Not those cancelled meanwhile.
        waiting = [(r, a) for r, a in self._waiting.pop(key) if not a.done()]
        if answer != "go" and waiting:
            counts = self._counts.setdefault(key, [0, 0, 0])
            counts[2 if answer is None else 0] += len(waiting)
            counts[1] += len(waiting) if gated else 0
        for req, answered in waiting:
            req.gated, req.captured = gated, captured
            answered.set_result(req)

    def _mark(self, began: int, key: tuple[int, int], why: str) -> None:
        """Put on the timeline that requests of ``key`` went ungated from now on, and why."""
        step, replica = key
        self._timeline.add((SPAN, UNGATED, began, now_ns(), step, why, "replica", replica))

    def _tally(self, key: tuple[int, int]) -> Tally:
        tally = self._tallies.get(key)
        if tally is None:
            tally = self._tallies[key] = Tally()
        return tally

    # -- keeping up with the driver -------------------------------------------------------------

    def _watch(self) -> None:
        """Keep watching the driver's view, from the first call in an event loop on."""
        if self._watching is not None or self._closing is not None or self._gone is not None:
            return
        if self._view.closing:  # joined as the driver closed: nothing to watch for
            self._close_soon()
            return
        with contextlib.suppress(RuntimeError):  # no event loop yet: the next call starts it
            loop = asyncio.get_running_loop()
            self._watching = loop.create_task(self._watch_hub(), name="aprof-hub-watch")

    async def _watch_hub(self) -> None:
        limit = WATCH_S + self.config.timeouts.connect_s
        while True:
            report = self._report()
            try:
                heard = self._heard = self._hub.watch.remote(
                    self.name, self._view.version, report
                ).future()
                async with asyncio.timeout(limit):
                    view = await asyncio.wrap_future(heard)
            except TimeoutError:  # slow, not gone: the next watch carries the next report
                continue
            except Exception as exc:
                self._lost(exc)
                return
            self._apply(view)
            if view.closing:  # its close is under way: nothing more to hear
                return

    def _apply(self, view: RolloutView) -> bool:
        """Take ``view`` unless it is not newer than the one held; whether it was."""
        if view.version <= self._view.version:
            return False
        step_changed = view.step != self._view.step
        self._view = view
        self._gate.step, self._gate.live = view.step, view.live
        # What an older view's answers said may differ now (queued → starting); a newer
        # answer stands (the view may come after it).
        self._known = {
            key: known
            for key, known in self._known.items()
            if key[0] == view.step and known[1] >= view.version
        }
        active = self._gate.active
        active.clear()
        if view.live and view.step is not None:
            for replica, phase in view.phases.items():
                if phase == "active":  # admitted here without a call into Python
                    active[replica] = self._tally((view.step, replica))
            for (_, replica), (known, _) in self._known.items():
                if known == "active":
                    active[replica] = self._tally((view.step, replica))
        if step_changed:
            self._timeline.flush()
        if view.closing:
            self._close_soon()
        return True

    def _close_soon(self) -> None:
        """Close as the driver's profiler closes: in a task of its own, not in the watch,
        which the close cancels and waits for."""
        if self._closing is not None:
            return
        with contextlib.suppress(RuntimeError):  # no event loop yet: the first call closes it
            self._closing = asyncio.get_running_loop().create_task(
                self._close(), name="aprof-remote-close"
            )

    def _report(self) -> Report:
        for key, tally in list(self._tallies.items()):
            if tally.admitted:
                self._counts.setdefault(key, [0, 0, 0])[0] += tally.admitted
                tally.admitted = 0
            if key[0] != self._view.step:  # its step is over: no request counts into it now
                del self._tallies[key]
        counts, self._counts = self._counts, {}
        report = Report(
            counts=[Counts(s, r, *c) for (s, r), c in counts.items()],
            ledger=self._timeline.take_ledger(),
        )
        timeline = self._timeline.plain_files()
        if timeline != self._sent_timeline:
            report.timeline = self._sent_timeline = timeline
        return report

    def _lost(self, exc: BaseException) -> None:
        """The hub is gone: from now on requests go ungated and uncounted, and the step
        stays the last one heard of."""
        if self._gone is None:
            self._gone = describe(exc)
            logger.warning(
                "aprof hub lost: requests go ungated", process=self.name, error=self._gone
            )
            view = self._view
            self._view = RolloutView(view.version, view.step, False, {})
            self._gate.live = False


def _delivered(
    future: concurrent.futures.Future[Any] | None,
) -> TypeGuard[concurrent.futures.Future[Any]]:
    """Whether Ray has delivered ``future``'s result (a failure is the awaiting task's)."""
    return (
        future is not None and future.done() and not future.cancelled() and not future.exception()
    )


def _end_if_cancelled(req: Request) -> Callable[[asyncio.Future[Request]], None]:
    def end(answered: asyncio.Future[Request]) -> None:
        if answered.cancelled():
            req._end(now_ns(), "CancelledError")

    return end
