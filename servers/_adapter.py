"""The skeleton every rollout adapter shares; each adapter module keeps only its dialect.

:class:`Adapter` is one replica's capture target: one capture at a time, every start and
stop under one lock, and a flag for a call of ours cut off on the way (the engine may then
hold a capture no stop was sent for: it is stopped before the next start). The in-process
engines of ``servers.engines`` build on it. :class:`HTTPAdapter` adds one HTTP session
(``open``/``aclose``, which makes it a ``ManagedTarget``), the start request and the stop
request with the faults they can meet, and the forward counter read from ``/metrics``;
``servers.vllm`` and ``servers.sglang`` build on it.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import aiohttp
import structlog

from aprof import (
    CaptureResult,
    CountSource,
    LimitsConfig,
    TargetKind,
    TimeoutsConfig,
    UsageError,
    Window,
    describe,
)
from servers._errors import ServerError
from servers._http import ServerClient, restart_error


def observed_steps(
    traced: int | None, counted: int | None
) -> tuple[int | None, CountSource | None]:
    """A window's forward steps and where they come from: what its traces hold beats the
    server's counter, which stands in when no trace could be read."""
    if traced is not None:
        return traced, "trace"
    return counted, None if counted is None else "counter"


class _Held(Protocol):
    """What an adapter records of the capture it holds (a small dataclass per dialect)."""

    @property
    def window(self) -> Window: ...


class _Counted(_Held, Protocol):
    @property
    def counter(self) -> int | None:
        """The server's forward counter once the start was answered."""
        ...


H = TypeVar("H", bound=_Held)
C = TypeVar("C", bound=_Counted)


class Adapter(abc.ABC, Generic[H]):
    """One replica's rollout capture target, holding at most one capture (an ``H``).

    ``start`` and ``stop`` run one at a time. A start is refused while a capture is held,
    a stop for any window but the held one; a capture is held only once :meth:`_start`
    returns (a start that raises leaves nothing held) and no longer from the moment its
    stop begins, whatever the stop's outcome.
    """

    kind: TargetKind = "rollout"
    enforces_window: bool
    """True when the engine itself skips ``delay`` and stops after ``forward_steps``."""

    def __init__(self, replica: int, /, *, logger: str, **context: object) -> None:
        self.name = f"replica_{replica}"
        self.replica: int | None = replica
        self._lock = asyncio.Lock()
        self._capture: H | None = None
        self._unsure = False
        """A start or stop of ours was cut off: the engine may still run a capture of ours."""
        self._log: Any = structlog.get_logger(logger).bind(**context, target=self.name)

    async def start(self, window: Window) -> None:
        """Start the capture of ``window``.

        Raises :class:`aprof.UsageError` (a ``RuntimeError``) if this adapter's previous
        capture is still active, and what the engine's start raises (see the adapter's class).
        """
        async with self._lock:
            self._ready()
            if self._capture is not None:
                raise UsageError(
                    f"{self.name}: the capture of {self._capture.window.prefix} is still active"
                )
            self._admit(window)
            if self._unsure:
                await self._clear_leftover()
            self._capture = await self._start(window)

    async def stop(self, window: Window) -> CaptureResult:
        """Stop the capture of ``window`` and say what it left.

        Raises :class:`aprof.UsageError` (a ``RuntimeError``) when this adapter did not
        start ``window`` (nothing is sent), and what the engine's stop raises (see the
        adapter's class).
        """
        async with self._lock:
            self._ready()
            capture = self._capture
            if capture is None or capture.window != window:
                raise UsageError(
                    f"{self.name}: this adapter did not start {window.prefix}: nothing stopped"
                )
            self._capture = None
            return await self._stop(capture)

    # -- the dialect ------------------------------------------------------------------------

    def _ready(self) -> None:
        """Raise if the target cannot take a start or stop yet (before ``open``, say)."""

    def _admit(self, window: Window) -> None:
        """Raise if ``window`` is one this target cannot capture; nothing has been sent."""

    @abc.abstractmethod
    async def _start(self, window: Window) -> H:
        """Start the engine's capture of ``window`` and return what the stop needs of it;
        set ``_unsure`` when the start is cut off after it may have reached the engine."""

    @abc.abstractmethod
    async def _stop(self, capture: H) -> CaptureResult:
        """Stop ``capture`` (no longer held) and report it; set ``_unsure`` when the stop
        may not have reached the engine."""

    async def _clear_leftover(self) -> None:
        """End what a start or stop of ours, cut off on the way, may have left running
        (called before a start while ``_unsure``). Adapters that set ``_unsure`` override it."""
        raise NotImplementedError(f"{type(self).__name__} cannot clear an interrupted capture")


class HTTPAdapter(Adapter[C]):
    """An :class:`Adapter` reaching its server over HTTP (``POST /start_profile``,
    ``POST /stop_profile``, ``GET /metrics``), with one session between ``open`` and
    ``aclose``.

    A start that reached the server and was answered 2xx is the adapter's: a stop is sent
    for it, even when reading the counter after it is cancelled (the next start or
    ``aclose`` sends it then). A start or stop cut off on the way is stopped the same way.
    """

    forward_metric: ClassVar[str]
    """The ``/metrics`` counter that rises by one per engine forward step."""

    def __init__(self, base_url: str, *, replica: int, api_key: str | None) -> None:
        self._client = ServerClient(base_url, replica=replica, api_key=api_key)
        super().__init__(replica, logger="servers", server=self._client.base_url, replica=replica)

    @property
    def base_url(self) -> str:
        """The server's URL as it is shown: without the user and password it was given with."""
        return self._client.base_url

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Open the HTTP session."""
        await self._client.open(timeouts, limits)

    async def aclose(self) -> None:
        """Close the HTTP session, after one stop (bounded by ``timeouts.connect_s``) when a
        start or stop of ours was cut off on the way: the run's last window leaves nothing
        running."""
        try:
            async with self._lock:
                if self._unsure:
                    await self._stop_leftover(self._client.timeouts.connect_s)
                    self._unsure = False
        except Exception as exc:
            self._log.warning("leftover capture not stopped", error=repr(exc))
        finally:
            await self._client.aclose()

    async def forward_steps(self) -> int | None:
        """The server's forward-step counter (``forward_metric``) from ``GET /metrics``,
        ``None`` if the server does not export it.

        Raises the HTTP errors of ``ServerClient.request``.
        """
        return await self._client.metric(self.forward_metric)

    async def _clear_leftover(self) -> None:
        await self._stop_leftover(self._client.timeouts.start_s)

    async def _send_start(self, body: Mapping[str, object] | None) -> int | None:
        """``POST /start_profile`` with ``body`` (bounded by ``timeouts.start_s``); once it
        is answered 2xx, the forward counter (``None`` when unreadable).

        Raises :meth:`_explain` of a non-2xx answer and what the request raises. A start
        cut off on the way, and one cancelled while the counter is read, set ``_unsure``:
        the caller counts the start as failed and sends no stop for it.
        """
        try:
            await self._client.request(
                "POST", "/start_profile", json=body, timeout_s=self._client.timeouts.start_s
            )
        except ServerError as exc:
            raise self._explain(exc) from None
        except aiohttp.ClientConnectorError:
            raise  # never reached the server: nothing of ours started
        except BaseException:
            self._unsure = True  # cut off on the way: our capture may run untracked
            raise
        self._unsure = False
        try:
            return await self._client.metric_or_none(self.forward_metric)
        except BaseException:
            self._unsure = True  # started, but the caller will not stop it
            raise

    async def _stop(self, capture: C) -> CaptureResult:
        # Until the stop is answered, one cut off on the way may leave the capture running.
        self._unsure = True
        count = await self._client.metric_or_none(self.forward_metric)
        ended, failure = await self._send_stop(capture)
        self._unsure = failure is not None
        error = restart_error(capture.counter, count) or failure
        return await self._result(capture, count, ended=ended, error=error)

    async def _send_stop(self, capture: C) -> tuple[bool, str | None]:
        """``POST /stop_profile`` (bounded by ``timeouts.stop_s``): whether the server had
        already ended the capture itself, and why the stop failed (``None`` if it did not).

        Raises ``TimeoutError`` when the stop is not answered in time: the profiler's own
        bound cuts it off the same way, and records a timed-out window.
        """
        try:
            await self._client.request(
                "POST", "/stop_profile", timeout_s=self._client.timeouts.stop_s
            )
        except TimeoutError:
            raise
        except ServerError as exc:
            if self._ended_by_server(exc, capture):
                return True, None
            return False, f"stop failed: {describe(self._explain(exc))}"
        except Exception as exc:  # a dead server may still have left its traces
            return False, f"stop failed: {describe(exc)}"
        return False, None

    # -- the dialect ------------------------------------------------------------------------

    def _explain(self, exc: ServerError) -> Exception:
        """The error a profile route's non-2xx answer stands for (``exc`` itself unless the
        dialect knows better)."""
        return exc

    def _ended_by_server(self, exc: ServerError, capture: C) -> bool:
        """Whether the stop's non-2xx answer means the server had already ended ``capture``."""
        return False

    @abc.abstractmethod
    async def _stop_leftover(self, timeout_s: float) -> None:
        """Send the stop that ends what an interrupted call may have left running."""

    @abc.abstractmethod
    async def _result(
        self, capture: C, count: int | None, *, ended: bool, error: str | None
    ) -> CaptureResult:
        """What the stopped ``capture`` left: ``count`` is the forward counter just before
        the stop, ``ended`` whether the server had ended the capture itself, ``error`` why
        the window failed (a failed stop, a restarted server), if it did."""
