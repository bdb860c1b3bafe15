"""SGLang over HTTP: one rollout capture target per server, which bounds its windows itself.

Each window writes into its own folder (``output_dir``) and ends after ``num_steps`` forward
batches on the server. A delay is a ``start_step`` computed from the forward counter read just
before the start, never a stale absolute one. A stop is always sent, also after the server's
own auto-stop; for a capture the server was told to end (or begin) on its own, its 500 means
"already stopped".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aprof import CaptureResult, Window
from servers._adapter import HTTPAdapter
from servers._http import ServerError
from servers.trace_files import outputs

FORWARD_METRIC = "sglang:num_forward_steps_total"
"""The scheduler's forward-batch counter (``forward_ct``) as the reference server exports it.
Released SGLang exports no such counter: a delay is then not applied (the result says so)."""


@dataclass(slots=True)
class _Capture:
    """A capture this adapter started and has not stopped."""

    window: Window
    num_steps: int | None
    """Forward batches the server was asked to record, ``None`` for until the stop."""
    start_step: int | None
    """The absolute ``start_step`` sent (a delayed start), if any."""
    note: str | None
    """What the start could not honour."""
    counter: int | None
    """The forward counter once the start was answered."""


class SGLangServer(HTTPAdapter[_Capture]):
    """An SGLang server reached over HTTP, as the rollout capture target of one replica.

    ``api_key`` is sent as ``Authorization: Bearer`` (the admin key when the server has
    one). ``npu=True`` follows the Ascend build, whose torch_npu profiler writes
    ``*_ascend_pt`` folders, listed as the window's files.

    ``start`` captures into ``window.dir`` on the server's file system; it raises
    ``ServerError`` for a non-2xx answer (SGLang answers 500 when it refuses). ``stop``
    lists the window's files; a stop that fails, and a server that restarted during the
    window, give a result with ``error`` set and the files found all the same; it raises
    ``TimeoutError`` when the stop is not answered within ``timeouts.stop_s``.
    """

    forward_metric = FORWARD_METRIC

    def __init__(
        self, base_url: str, *, replica: int, api_key: str | None = None, npu: bool = False
    ) -> None:
        super().__init__(base_url, replica=replica, api_key=api_key)
        self.enforces_window = True
        """SGLang ends each bounded window itself (``num_steps``)."""
        self.npu = npu

    async def _start(self, window: Window) -> _Capture:
        body, start_step, note = await self._start_body(window)
        counter = await self._send_start(body)
        return _Capture(window, window.forward_steps, start_step, note, counter)

    async def _result(
        self, capture: _Capture, count: int | None, *, ended: bool, error: str | None
    ) -> CaptureResult:
        # A stop while a start_step capture is still pending answers 500 too, and the
        # capture then still begins: it was never recorded, and the next start must
        # first stop it (else that start answers 500 "already in progress").
        pending = ended and not _begun(capture, count)
        if pending:
            self._unsure = True
        files = await asyncio.to_thread(outputs, capture.window.dir, self.npu)
        return CaptureResult(
            files=files,
            forward_steps=_observed(capture, count),
            auto_stopped=ended and not pending,
            note=self._note(capture, files),
            error=error,
        )

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

    async def _stop_leftover(self, timeout_s: float) -> None:
        """End what a start or stop of ours, cut off on the way, may have left running."""
        self._log.info("stopping what an interrupted call may have left running")
        try:
            await self._client.request("POST", "/stop_profile", timeout_s=timeout_s)
        except ServerError as exc:
            if exc.status != 500:  # 500: nothing was running
                raise

    def _ended_by_server(self, exc: ServerError, capture: _Capture) -> bool:
        # 500 is SGLang's answer to a stop with nothing running; only a capture the
        # server was told to end (or begin) on its own may legitimately be gone.
        scheduled = capture.num_steps is not None or capture.start_step is not None
        if exc.status == 500 and scheduled:
            self._log.info("stop answered 500: the server had already ended the capture")
            return True
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
