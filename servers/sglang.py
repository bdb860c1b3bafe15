"""SGLang over HTTP: one rollout capture target per server, which bounds its windows itself.

Each window writes into its own folder (``output_dir``) and ends after ``num_steps`` forward
batches on the server. A delay is a ``start_step`` computed from the forward counter read just
before the start, never a stale absolute one. A stop is always sent, also after the server's
own auto-stop; for a capture the server was told to end (or begin) on its own, its 500 means
"already stopped". The facts (checked against a real SGLang 0.5.23 server): the forward
counter is ``sglang:cuda_graph_passes_total`` summed over its modes (``--enable-metrics``);
each forward pass is one ``step[...]`` annotation in the trace; the version is the
``"version"`` of ``/server_info`` (``/version`` is 404).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aprof import CaptureResult, LimitsConfig, TimeoutsConfig, Window
from servers._adapter import HTTPAdapter, observed_steps
from servers._errors import ServerError
from servers.trace_files import outputs, sglang_steps_in
from servers.versions import Version, parse_version, version_text

FORWARD_METRIC = "sglang:cuda_graph_passes_total"
"""Forward passes by mode (``mode="prefill_none"``, ``"decode_none"``, ...), counted also with
CUDA graphs off; summed over modes it is the forward-step counter (SGLang exports none named
so). Needs ``--enable-metrics``; without it a delay is not applied (the result says so)."""
INFO_PATHS = ("/server_info", "/get_server_info")
"""Where SGLang reports its settings and ``"version"`` (the older name second)."""


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
    ``*_ascend_pt`` folders, listed as the window's files. ``version`` (``"0.5.23"``) is
    read from ``GET /server_info`` when the target opens if not given. ``with_stack`` and
    ``record_shapes`` are sent in every start (both off unless asked: the server's
    defaults, on, bloat traces).

    ``start`` captures into ``window.dir`` on the server's file system; it raises
    ``ServerError`` for a non-2xx answer (SGLang answers 500 when it refuses). ``stop``
    lists the window's files; a stop that fails, and a server that restarted during the
    window, give a result with ``error`` set and the files found all the same; it raises
    ``TimeoutError`` when the stop is not answered within ``timeouts.stop_s``. A start is
    refused (``UsageError``, a ``RuntimeError``; nothing sent) while this adapter holds a
    capture: a second start on SGLang would silently restart the running capture.
    """

    forward_metric = FORWARD_METRIC

    def __init__(
        self,
        base_url: str,
        *,
        replica: int,
        api_key: str | None = None,
        npu: bool = False,
        version: str | None = None,
        with_stack: bool = False,
        record_shapes: bool = False,
    ) -> None:
        super().__init__(base_url, replica=replica, api_key=api_key)
        self.enforces_window = True
        """SGLang ends each bounded window itself (``num_steps``)."""
        self.npu = npu
        self.with_stack = with_stack
        """Sent as ``with_stack`` in every start (the server's default is True)."""
        self.record_shapes = record_shapes
        """Sent as ``record_shapes`` in every start (the server's default is True)."""
        self._version = parse_version(version) if version is not None else None

    @property
    def version(self) -> Version | None:
        """The server's ``(major, minor, patch)``; ``None`` when not given and unreadable."""
        return self._version

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Open the HTTP session and read the version from ``GET /server_info`` (else
        ``/get_server_info``) if it was not given. Nothing depends on the version yet: one
        that cannot be read is logged and left unknown."""
        await super().open(timeouts, limits)
        try:
            if self._version is None:
                self._version = await self._read_version(timeouts.start_s)
        except BaseException:
            # A target whose open failed is never closed by the profiler: close the session.
            await self._client.aclose()
            raise
        self._log.info(
            "sglang target open",
            version=version_text(self._version) if self._version is not None else None,
        )

    async def _read_version(self, timeout_s: float) -> Version | None:
        failures = []
        for path in INFO_PATHS:
            try:
                return await self._client.version(path, timeout_s=timeout_s)
            except ServerError as exc:
                failures.append(f"{path}: {exc.status}")
                if exc.status != 404:
                    break
            except Exception as exc:  # unreachable, not JSON, no version: unknown
                failures.append(f"{path}: {exc!r}")
                break
        self._log.warning("sglang version unknown", failures=failures)
        return None

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
        # What the traces hold beats the counter; a server that restarted lost the capture.
        restarted = capture.counter is not None and count is not None and count < capture.counter
        counted = not (self.npu or restarted)
        traced = await asyncio.to_thread(sglang_steps_in, files) if counted else None
        observed, counted_from = observed_steps(traced, _observed(capture, count))
        return CaptureResult(
            files=files,
            forward_steps=observed,
            counted_from=counted_from,
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
            # Both default to True on the server: large traces, and an open capture on an
            # idle server grows without bound.
            "with_stack": self.with_stack,
            "record_shapes": self.record_shapes,
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
