"""vLLM over HTTP: one rollout capture target per server, speaking its version's protocol.

The eras (see ``docs/servers.md``): up to 0.12 profiling is enabled by an environment
variable, from 0.13 by ``--profiler-config``; from 0.12 the server can bound a capture with
launch-time iteration limits, from 0.32 per call; from 0.30 a stop with nothing running is a
harmless no-op, before that it can crash the server.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aprof import CaptureResult, LimitsConfig, TimeoutsConfig, UsageError, Window
from servers import vllm_traces
from servers._adapter import HTTPAdapter, observed_steps
from servers._errors import (
    ProfilingDisabledError,
    ServerError,
    SessionConflictError,
    UnsupportedError,
)
from servers.trace_files import vllm_prefix
from servers.versions import Version, parse_version, version_text

FORWARD_METRIC = "vllm:iteration_tokens_total_count"
"""Rises by one per engine step that produces output (the only step counter vLLM exports)."""

_LAUNCH_BOUNDS: Version = (0, 12, 0)  # VLLM_PROFILER_{DELAY,MAX}_ITERS, then ProfilerConfig
_CONFIG_FLAG: Version = (0, 13, 0)  # --profiler-config replaces VLLM_TORCH_PROFILER_DIR
SAFE_EMPTY_STOP: Version = (0, 30, 0)  # before: a stop with nothing running: 500 or a crash
_PER_CALL: Version = (0, 32, 0)  # start body with prefix and bounds; 409 on a second start


def enable_hint(version: Version, profiler_dir: Path | None) -> str:
    """How to launch vLLM ``version`` with the torch profiler writing into ``profiler_dir``."""
    where = str(profiler_dir) if profiler_dir is not None else "/path/to/traces"
    if version < _CONFIG_FLAG:
        return f"set VLLM_TORCH_PROFILER_DIR={where} in the server's environment"
    return (
        "launch it with --profiler-config.profiler=torch "
        f"--profiler-config.torch_profiler_dir={where}"
    )


@dataclass(slots=True)
class _Capture:
    """A capture this adapter started and has not stopped."""

    window: Window
    since: vllm_traces.Mark
    """``profiler_dir`` just before the start was sent."""
    counter: int | None
    """The forward-step counter once the start was answered."""


class VLLMServer(HTTPAdapter[_Capture]):
    """A vLLM server reached over HTTP, as the rollout capture target of one replica.

    ``version`` (``"0.32.0"``) is read from ``GET /version`` when the target opens if not
    given. ``profiler_dir`` is the trace directory the server was launched with; when this
    process can reach it, each window's traces are moved into the window's folder.
    ``launch_window=(delay_iterations, max_iterations)`` declares the bounds a 0.12-0.31
    server was launched with: it then ends every window itself, and each window must ask
    for exactly those bounds. ``enforces_window`` is known once the target is open.

    ``start`` raises ``ProfilingDisabledError`` (404), ``SessionConflictError`` (409),
    ``UnsupportedError`` when the window's bounds differ from ``launch_window``,
    ``ServerError`` for other answers. ``stop`` is sent also after a server-side auto-stop
    (vLLM needs it before the next start) and moves the window's traces into its folder; a
    stop that fails, and a server that restarted during the window, give a result with
    ``error`` set and the files found all the same; it raises ``TimeoutError`` when the stop
    is not answered within ``timeouts.stop_s``. Both raise ``UsageError`` before ``open``.
    """

    forward_metric = FORWARD_METRIC

    def __init__(
        self,
        base_url: str,
        *,
        replica: int,
        api_key: str | None = None,
        version: str | None = None,
        profiler_dir: str | os.PathLike[str] | None = None,
        launch_window: tuple[int, int] | None = None,
    ) -> None:
        if launch_window is not None and (len(launch_window) != 2 or min(launch_window) < 0):
            raise ValueError(f"launch_window is (delay, max) with both >= 0, got {launch_window}")
        super().__init__(base_url, replica=replica, api_key=api_key)
        self.enforces_window = False
        """True when the server bounds each window itself (per call from 0.32, or at launch)."""
        self._version = parse_version(version) if version is not None else None
        self._profiler_dir = Path(profiler_dir) if profiler_dir is not None else None
        self._launch_window = launch_window

    @property
    def version(self) -> Version | None:
        """The server's ``(major, minor, patch)``, ``None`` until known."""
        return self._version

    async def open(self, timeouts: TimeoutsConfig, limits: LimitsConfig | None = None) -> None:
        """Open the HTTP session and learn the version (``GET /version``) if it was not given.

        Raises ``VersionError`` for an unreadable version, ``UnsupportedError`` for a
        ``launch_window`` the version cannot honour, and the HTTP errors of
        ``ServerClient.request``.
        """
        await super().open(timeouts, limits)
        try:
            if self._version is None:
                self._version = await self._client.version("/version", timeout_s=timeouts.start_s)
            self.enforces_window = self._bounds_by_server(self._version)
        except BaseException:
            # A target whose open failed is never closed by the profiler: close the session.
            await self._client.aclose()
            raise
        self._log.info(
            "vllm target open",
            version=version_text(self._version),
            enforces_window=self.enforces_window,
        )

    async def _start(self, window: Window) -> _Capture:
        version = self._opened_version()
        since = await vllm_traces.mark(self._profiler_dir, by_prefix=version >= _PER_CALL)
        counter = await self._send_start(self._start_body(window, version))
        return _Capture(window, since, counter)

    async def _result(
        self, capture: _Capture, count: int | None, *, ended: bool, error: str | None
    ) -> CaptureResult:
        traces, note = await self._collect(capture, self._opened_version())
        observed, auto_stopped = self._observed(capture, count)
        observed, counted_from = observed_steps(traces.steps, observed)
        return CaptureResult(
            files=traces.files,
            forward_steps=observed,
            counted_from=counted_from,
            auto_stopped=auto_stopped,
            note=note,
            error=error,
        )

    # -- protocol ---------------------------------------------------------------------------

    def _bounds_by_server(self, version: Version) -> bool:
        if version >= _PER_CALL:
            return True
        if self._launch_window is None:
            return False
        if version < _LAUNCH_BOUNDS:
            raise UnsupportedError(
                f"vLLM {version_text(version)} cannot bound captures at launch (0.12+): "
                "drop launch_window"
            )
        return self._launch_window[1] > 0

    def _ready(self) -> None:
        self._opened_version()

    def _admit(self, window: Window) -> None:
        if not self.enforces_window or self._launch_window is None:
            return
        if self._opened_version() >= _PER_CALL:
            return  # the per-call body overrides the launch-time bounds
        delay, most = self._launch_window
        wanted = (window.delay, window.forward_steps or 0)
        if wanted != (skipped_steps(delay), most):
            raise UnsupportedError(
                f"{self.name} was launched with delay_iterations={delay}, max_iterations={most} "
                f"(skip {skipped_steps(delay)} steps, record {most}), but the window skips "
                f"{window.delay} and records {window.forward_steps}: launch it with "
                f"delay_iterations={delay_iterations(window.delay)}, max_iterations={wanted[1]}, "
                "or leave launch_window unset to let aprof bound windows by polling"
            )

    def _start_body(self, window: Window, version: Version) -> dict[str, object] | None:
        """The per-call bounds of 0.32+; earlier versions ignore any body."""
        if version < _PER_CALL:
            return None
        return {
            "profile_prefix": vllm_prefix(window.prefix),
            "delay_iterations": delay_iterations(window.delay),
            "max_iterations": window.forward_steps or 0,  # 0: until /stop_profile
        }

    def _explain(self, exc: ServerError) -> Exception:
        url = self._client.base_url
        version = self._opened_version()
        if exc.status == 404:
            return ProfilingDisabledError(
                f"profiling was not enabled at the launch of vLLM {version_text(version)} "
                f"at {url} "
                f"({exc.method} {exc.url} answered 404): "
                + enable_hint(version, self._profiler_dir)
            )
        if exc.status == 409 and self._unsure:
            return SessionConflictError(
                f"a profiling session is active on {url} (start answered 409): most likely the "
                "one an interrupted start or stop of this adapter left behind, which lands "
                "late; it is stopped before this replica's next window"
            )
        if exc.status == 409:
            return SessionConflictError(
                f"a profiling session aprof did not start is active on {url} (start answered "
                "409); aprof does not stop it: its owner ends it with POST /stop_profile"
            )
        return exc

    async def _stop_leftover(self, timeout_s: float) -> None:
        """End the session an interrupted start or stop of ours may have left running (the
        flag stays up until a start succeeds: a cut-off start may land after this stop)."""
        if self._opened_version() < SAFE_EMPTY_STOP:
            # A stop with nothing running answers 500 and may crash vLLM before 0.30.
            self._log.warning(
                "an interrupted call may have left a capture running; not stopped on this version"
            )
        else:
            self._log.info("stopping what an interrupted call may have left running")
            try:
                await self._client.request("POST", "/stop_profile", timeout_s=timeout_s)
            except ServerError as exc:
                raise self._explain(exc) from None

    def _opened_version(self) -> Version:
        if self._version is None:
            raise UsageError(f"{self.name}: open() the target before starting captures")
        return self._version

    # -- results ----------------------------------------------------------------------------

    def _server_bounds(self, window: Window) -> tuple[int, int] | None:
        """``(skipped, max)`` steps the server applies to ``window``; ``None`` when aprof
        bounds it."""
        if not self.enforces_window:
            return None
        if self._opened_version() >= _PER_CALL:
            return window.delay, window.forward_steps or 0
        assert self._launch_window is not None  # enforces_window says so before 0.32
        delay, most = self._launch_window
        return skipped_steps(delay), most

    def _observed(self, capture: _Capture, count: int | None) -> tuple[int | None, bool]:
        """Forward steps the capture saw (counter delta) and whether the server ended it."""
        if capture.counter is None or count is None or count < capture.counter:
            return None, False  # no counter, or the server restarted in between
        delta = count - capture.counter
        bounds = self._server_bounds(capture.window)
        if bounds is None:
            return delta, False
        skipped, most = bounds
        captured = max(0, delta - skipped)
        if most == 0:
            return captured, False
        # The server ends the capture inside the step after its last one.
        return min(captured, most), delta > skipped + most

    async def _collect(
        self, capture: _Capture, version: Version
    ) -> tuple[vllm_traces.Traces, str | None]:
        """Move the window's traces into its folder; returns them and a note, if any."""
        source = self._profiler_dir
        window = capture.window
        if source is None:
            return vllm_traces.Traces(), (
                "traces stay where vLLM wrote them (its launch-time profiler directory); "
                f"give VLLMServer profiler_dir= to have them moved into {window.dir}"
            )
        prefix = vllm_prefix(window.prefix) if version >= _PER_CALL else None
        traces = await vllm_traces.collect(source, window, capture.since, prefix)
        if traces is None:
            return vllm_traces.Traces(), (
                f"traces stay where vLLM wrote them: {source} is not reachable from here"
            )
        if traces.kept:
            return traces, (
                f"{len(traces.kept)} trace file(s) could not be moved from {source}: "
                "listed where vLLM wrote them"
            )
        if not traces.moved:
            how = f"named {prefix}_*" if prefix else "written during the window"
            return traces, f"no trace files {how} in {source}"
        return traces, None


def delay_iterations(skip: int) -> int:
    """vLLM's ``delay_iterations`` that skips ``skip`` engine steps.

    vLLM starts recording inside the step where its count since the start reaches
    ``delay_iterations`` (before that step's forward), so a value D skips D - 1 steps.
    """
    return skip + 1 if skip > 0 else 0


def skipped_steps(delay_iterations: int) -> int:
    """Engine steps vLLM skips for a ``delay_iterations`` value (the inverse of the above)."""
    return max(delay_iterations - 1, 0)
