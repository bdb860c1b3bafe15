"""SGLang over HTTP: one rollout capture target per server, which bounds its windows itself.

Each window writes into its own folder (``output_dir``) and ends after ``num_steps`` forward
batches on the server. A delay is a ``start_step`` computed from the forward counter read just
before the start, never a stale absolute one. A stop is not sent once the auto-stop has
certainly run (it would answer 500); when it might have, a 500 is read as "already stopped".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog

from aprof import CaptureResult, LimitsConfig, TargetKind, TimeoutsConfig, Window
from servers._http import ServerClient, ServerError
from servers.trace_files import outputs

FORWARD_METRIC = "sglang:num_forward_steps_total"
"""The scheduler's forward-batch counter (``forward_ct``) as the reference server exports it.
Released SGLang exports no such counter: a delay is then not applied (the result says so)."""


@dataclass(frozen=True, slots=True)
class _Capture:
    """A capture this adapter started and has not stopped."""

    window: Window
    num_steps: int | None
    """Forward batches the server was asked to record, ``None`` for until the stop."""
    start_step: int | None
    """The absolute ``start_step`` sent (a delayed start), if any."""
    counter: int | None
    """The forward counter once the start was answered."""
    note: str | None
    """What the start could not honour."""

    @property
    def done_at(self) -> int | None:
        """A counter value by which the server has certainly ended the capture itself."""
        if self.num_steps is None or self.counter is None:
            return None
        # The capture begins at the latest with the batch after the start (or at start_step);
        # the server ends it before the forward of batch begins + num_steps, so it is over
        # once the counter of completed batches reaches that one.
        begins = max(self.start_step or 0, self.counter + 1)
        return begins + self.num_steps


class SGLangServer:
    """An SGLang server reached over HTTP, as the rollout capture target of one replica.

    ``api_key`` is sent as ``Authorization: Bearer`` (the admin key when the server has
    one). ``npu=True`` follows the Ascend build, whose torch_npu profiler writes
    ``*_ascend_pt`` folders, listed as the window's files.
    """

    kind: TargetKind = "rollout"

    def __init__(
        self, base_url: str, *, replica: int, api_key: str | None = None, npu: bool = False
    ) -> None:
        self.name = f"replica_{replica}"
        self.replica: int | None = replica
        self.enforces_window = True
        """SGLang ends each bounded window itself (``num_steps``)."""
        self.npu = npu
        self._client = ServerClient(base_url, replica=replica, api_key=api_key)
        self._lock = asyncio.Lock()
        self._capture: _Capture | None = None
        self._unsure = False
        """A start or stop of ours was cut off: the server may still run our capture."""
        self._log = structlog.get_logger("servers").bind(
            server=self._client.base_url, replica=replica, target=self.name
        )

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Open the HTTP session."""
        await self._client.open(timeouts, limits)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        await self._client.aclose()

    async def start(self, window: Window) -> None:
        """Start the capture of ``window`` into ``window.dir`` on the server's file system.

        Raises ``ServerError`` for a non-2xx answer (SGLang answers 500 when it refuses) and
        ``RuntimeError`` if a capture of this adapter is still active.
        """
        async with self._lock:
            if self._capture is not None:
                raise RuntimeError(
                    f"{self.name}: the capture of {self._capture.window.prefix} is still active"
                )
            if self._unsure:
                await self._clear_leftover()
            body, start_step, note = await self._start_body(window)
            try:
                await self._client.request(
                    "POST", "/start_profile", json=body, timeout_s=self._client.timeouts.start_s
                )
                counter = await self._client.metric_or_none(FORWARD_METRIC)
            except (ServerError, aiohttp.ClientConnectorError):
                raise  # answered, or never reached the server: nothing of ours started
            except BaseException:
                self._unsure = True  # cut off on the way: our capture may run untracked
                raise
            self._capture = _Capture(window, window.forward_steps, start_step, counter, note)
            self._unsure = False

    async def stop(self, window: Window) -> CaptureResult:
        """Stop the capture of ``window`` unless the server has certainly ended it, and list
        its files.

        Raises ``RuntimeError`` when this adapter did not start ``window`` (no stop is sent),
        ``ServerError`` for a non-2xx answer other than a 500 on a capture the server may
        have ended itself.
        """
        async with self._lock:
            capture = self._capture
            if capture is None or capture.window != window:
                raise RuntimeError(
                    f"{self.name}: this adapter did not start {window.prefix}: nothing stopped"
                )
            # The capture is no longer one this adapter runs; until the stop is answered, a
            # stop cut off on the way may leave it running.
            self._capture = None
            self._unsure = True
            count = await self._client.metric_or_none(FORWARD_METRIC)
            done_at = capture.done_at
            auto_stopped = done_at is not None and count is not None and count >= done_at
            pending = False
            if not auto_stopped:
                auto_stopped = await self._send_stop(capture)
                # A stop while a start_step capture is still pending answers 500 too, and the
                # capture then still begins: it was never recorded, and the next start must
                # first stop it (else that start answers 500 "already in progress").
                pending = auto_stopped and not _begun(capture, count)
                auto_stopped = auto_stopped and not pending
            self._unsure = pending
            files = await asyncio.to_thread(outputs, window.dir, self.npu)
            return CaptureResult(
                files=files,
                forward_steps=_observed(capture, count),
                auto_stopped=auto_stopped,
                note=self._note(capture, files),
            )

    async def forward_steps(self) -> int | None:
        """The forward-batch counter from ``GET /metrics``, ``None`` if the server has none.

        Raises the HTTP errors of ``ServerClient.request``.
        """
        return await self._client.metric(FORWARD_METRIC)

    async def _start_body(self, window: Window) -> tuple[dict[str, object], int | None, str | None]:
        """The start request's body, the ``start_step`` it holds and what it cannot honour."""
        body: dict[str, object] = {
            "output_dir": str(window.dir),
            "profile_id": window.prefix,
            "activities": ["CPU", "GPU"],  # "GPU" is the NPU on Ascend builds
            "with_stack": False,  # both default to True on the server: large traces
            "record_shapes": False,
        }
        if window.forward_steps is not None:
            body["num_steps"] = window.forward_steps
        if not window.delay:
            return body, None, None
        current = await self._client.metric_or_none(FORWARD_METRIC)
        if current is None:
            note = f"delay of {window.delay} not applied: the server reports no forward counter"
            return body, None, note
        # start_step counts batches since launch: skip `delay` batches from now.
        body["start_step"] = start_step = current + window.delay + 1
        return body, start_step, None

    async def _clear_leftover(self) -> None:
        """End what a start or stop of ours, cut off on the way, may have left running."""
        self._log.info("stopping what an interrupted call may have left running")
        try:
            await self._client.request(
                "POST", "/stop_profile", timeout_s=self._client.timeouts.start_s
            )
        except ServerError as exc:
            if exc.status != 500:  # 500: nothing was running
                raise

    async def _send_stop(self, capture: _Capture) -> bool:
        """Send the stop; True when the server had already ended the capture itself."""
        try:
            await self._client.request(
                "POST", "/stop_profile", timeout_s=self._client.timeouts.stop_s
            )
        except ServerError as exc:
            # 500 is SGLang's answer to a stop with nothing running; only a capture the
            # server was told to end (or begin) on its own may legitimately be gone.
            scheduled = capture.num_steps is not None or capture.start_step is not None
            if exc.status == 500 and scheduled:
                self._log.info("stop answered 500: the server had already ended the capture")
                return True
            raise
        return False

    def _note(self, capture: _Capture, files: tuple[Path, ...]) -> str | None:
        notes = [capture.note] if capture.note else []
        if not files:
            what = "*_ascend_pt folders" if self.npu else "trace files"
            notes.append(
                f"no {what} in {capture.window.dir}: a server on another machine writes them "
                "under the same path on its own disk"
            )
        elif self.npu:
            notes.append("NPU traces: parse with torch_npu.profiler.profiler.analyse(<folder>)")
        return "; ".join(notes) or None


def _begun(capture: _Capture, count: int | None) -> bool:
    """Whether the counter shows that a delayed (``start_step``) capture has begun."""
    if capture.start_step is None:
        return True
    return count is not None and count >= capture.start_step


def _observed(capture: _Capture, count: int | None) -> int | None:
    """Forward batches the capture recorded, from the counter delta over the window."""
    if capture.counter is None or count is None or count < capture.counter:
        return None  # no counter, or the server restarted in between
    begins = max(capture.start_step or 0, capture.counter + 1)
    recorded = max(0, count - begins + 1)
    return recorded if capture.num_steps is None else min(recorded, capture.num_steps)
