"""In-process engines as rollout capture targets: vLLM `AsyncLLM`, SGLang `TokenizerManager`.

For users whose engine lives in their own process (as verl's server actors do): the same
windows as the HTTP adapters, driven by awaiting the engine's own profiling coroutines on the
engine's event loop. Neither vLLM nor SGLang is imported at module level.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aprof import CaptureResult, Window
from servers import vllm_traces
from servers._adapter import Adapter, observed_steps
from servers._errors import VersionError
from servers.trace_files import is_vllm_worker_trace, listing, outputs, vllm_prefix
from servers.versions import Version, parse_version
from servers.vllm import SAFE_EMPTY_STOP, delay_iterations

_PREFIX_EVERY_START: Version = (0, 30, 0)  # vLLM 0.17-0.29 keep the first prefix of the engine
_SGLANG_EXACT_STEPS: Version = (0, 5, 20)  # SGLang: before, plain num_steps records one less
_SGLANG_ACTIVITIES = {"cpu": "CPU", "cuda": "GPU", "npu": "GPU", "memory": "MEM"}
_LOGGER = "aprof.servers"


@dataclass(frozen=True, slots=True)
class _VLLMCapture:
    """A capture a ``VLLMEngine`` started and has not stopped."""

    window: Window
    since: vllm_traces.Mark
    """``profiler_dir`` just before the start."""


class VLLMEngine(Adapter[_VLLMCapture]):
    """A vLLM ``AsyncLLM`` (or any ``EngineClient``) of this process as a rollout target.

    The engine must have been built with a torch ``profiler_config`` (with
    ``ignore_frontend=True``: vLLM 0.32 starts and stops the front-end profiler on different
    threads, and torch 2.13 then segfaults); its trace folder is read from the engine (or
    given as ``profiler_dir``) and each window's files are moved into the window's folder.
    From vLLM 0.32 the engine bounds each window itself (``delay_iterations`` and
    ``max_iterations`` per call); before, windows run until the step ends (no forward counter
    in-process). ``version`` defaults to the installed vLLM's.

    ``start`` raises what the engine raises (not enabled, already active). ``stop`` is sent
    also after the engine's auto-stop (vLLM needs it before the next start); it moves the
    window's files into ``window.dir`` and counts the steps they hold.
    """

    def __init__(
        self,
        engine: Any,
        *,
        replica: int,
        version: str | None = None,
        profiler_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(replica, logger=_LOGGER, engine="vllm")
        self._engine = engine
        self._version = parse_version(version or _installed_version("vllm"))
        accepted = inspect.signature(engine.start_profile).parameters
        self._prefixed = "profile_prefix" in accepted
        self.enforces_window = "max_iterations" in accepted
        """True when the engine takes per-call bounds (vLLM 0.32+)."""
        folder = profiler_dir or _engine_profiler_dir(engine)
        self._profiler_dir = Path(folder) if folder else None

    async def _start(self, window: Window) -> _VLLMCapture:
        kwargs: dict[str, object] = {}
        if self._prefixed:
            kwargs["profile_prefix"] = vllm_prefix(window.prefix)
        if self.enforces_window:
            kwargs["delay_iterations"] = delay_iterations(window.delay)
            kwargs["max_iterations"] = window.forward_steps or 0  # 0: until the stop
        since = await vllm_traces.mark(self._profiler_dir, by_prefix=self._by_prefix)
        try:
            await self._engine.start_profile(**kwargs)
        except (asyncio.CancelledError, TimeoutError):
            self._unsure = True  # vLLM: a cancelled start may still take effect
            raise
        return _VLLMCapture(window, since)

    async def _stop(self, capture: _VLLMCapture) -> CaptureResult:
        window = capture.window
        auto_stopped = self.enforces_window and bool(await self._worker_files_waiting(window))
        try:
            await self._engine.stop_profile()
        except BaseException:
            self._unsure = True
            raise
        return await self._collect(capture, auto_stopped)

    async def forward_steps(self) -> int | None:
        """``None``: an in-process engine exports no forward-step counter."""
        return None

    @property
    def _by_prefix(self) -> bool:
        # Files are matched by prefix where every start sets it, else by modification time.
        return self._prefixed and self._version >= _PREFIX_EVERY_START

    async def _worker_files_waiting(self, window: Window) -> list[str]:
        entries = await asyncio.to_thread(listing, self._profiler_dir) or {}
        head = vllm_prefix(window.prefix) + "_"
        return [n for n in entries if n.startswith(head) and is_vllm_worker_trace(Path(n))]

    async def _clear_leftover(self) -> None:
        if self._version >= SAFE_EMPTY_STOP:
            self._log.info("stopping what an interrupted call may have left running")
            await self._engine.stop_profile()
        else:
            self._log.warning("an interrupted call may have left a capture running")
        self._unsure = False

    async def _collect(self, capture: _VLLMCapture, auto_stopped: bool) -> CaptureResult:
        window = capture.window
        source = self._profiler_dir
        if source is None:
            note = "the engine's trace folder is unknown: pass profiler_dir= to collect traces"
            return CaptureResult(auto_stopped=auto_stopped, note=note)
        prefix = vllm_prefix(window.prefix) if self._by_prefix else None
        traces = await vllm_traces.collect(source, window, capture.since, prefix)
        if traces is None:
            note = f"traces stay where vLLM wrote them: {source} is not reachable"
            return CaptureResult(auto_stopped=auto_stopped, note=note)
        forward_steps, counted_from = observed_steps(traces.steps, None)
        how = f"prefix {prefix}_" if prefix else "modification time"
        return CaptureResult(
            files=traces.files,
            forward_steps=forward_steps,
            counted_from=counted_from,
            auto_stopped=auto_stopped,
            note=f"{len(traces.files)} file(s) matched by {how}",
        )


@dataclass(frozen=True, slots=True)
class _SGLangCapture:
    """A capture a ``SGLangEngine`` started and has not stopped."""

    window: Window
    scheduled: bool
    """The capture was told to end (or begin) on its own."""
    note: str | None
    """What the start could not honour."""
    begins: int | None
    """The forward count of the capture's first batch, if a counter was given."""


class SGLangEngine(Adapter[_SGLangCapture]):
    """A SGLang ``TokenizerManager`` of this process as a rollout target.

    Each window writes into its own folder (``output_dir``) and ends after ``num_steps``
    forward batches. ``forward_counter`` (an async callable returning the scheduler's
    forward count) lets a delay become a fresh absolute ``start_step``; without it a delay
    is not applied and the result says so. ``contents`` are aprof's torch/npu contents
    (``cpu``, ``cuda``/``npu``, ``memory``, ``stack``, ``shapes``). ``npu=True`` lists the
    torch_npu ``*_ascend_pt`` folders as the window's files.

    Both shapes of ``TokenizerManager.start_profile`` are handled, found from its signature:
    keyword arguments (up to 0.5.10, as verl calls it) and one ``ProfileReq`` (0.5.15+).

    ``start`` raises the engine's RuntimeError when it refuses. ``stop`` is always sent
    (the engine's "not in progress" after its own auto-stop is read as already stopped) and
    lists the window's files.
    """

    enforces_window = True

    def __init__(
        self,
        tokenizer_manager: Any,
        *,
        replica: int,
        version: str | None = None,
        contents: Iterable[str] = ("cpu", "cuda"),
        npu: bool = False,
        forward_counter: Callable[[], Awaitable[int | None]] | None = None,
    ) -> None:
        super().__init__(replica, logger=_LOGGER, engine="sglang")
        self._manager = tokenizer_manager
        self._version = parse_version(version or _installed_version("sglang"))
        self._keywords = set(inspect.signature(tokenizer_manager.start_profile).parameters)
        self._contents = set(contents)
        self._npu = npu
        self._counter = forward_counter

    async def _start(self, window: Window) -> _SGLangCapture:
        fields, note = await self._fields(window)
        if "output_dir" in self._keywords:  # keyword form (verl's call)
            await self._manager.start_profile(
                **{k: v for k, v in fields.items() if k in self._keywords}
            )
        else:
            await self._manager.start_profile(_profile_req(fields))
        scheduled = "num_steps" in fields or "start_step" in fields
        # The capture begins with the next batch, or at start_step.
        counter = await self._counter_or_none()
        begins = None if counter is None else max(counter + 1, _int(fields.get("start_step")))
        return _SGLangCapture(window, scheduled, note, begins)

    async def _stop(self, capture: _SGLangCapture) -> CaptureResult:
        window = capture.window
        auto_stopped = await self._send_stop(capture)
        files = await asyncio.to_thread(outputs, window.dir, self._npu)
        note = capture.note
        if not files:
            note = "; ".join(filter(None, [note, f"no trace files in {window.dir}"]))
        return CaptureResult(
            files=files,
            forward_steps=await self._observed(capture),
            auto_stopped=auto_stopped,
            note=note,
        )

    async def forward_steps(self) -> int | None:
        """The scheduler's forward count from ``forward_counter``, ``None`` without one."""
        return await self._counter() if self._counter is not None else None

    async def _counter_or_none(self) -> int | None:
        """``forward_steps()``, ``None`` when ``forward_counter`` fails: once the engine has
        started or stopped a capture, a counter failure must not undo that bookkeeping."""
        try:
            return await self.forward_steps()
        except Exception as exc:
            self._log.warning("forward counter failed", error=repr(exc))
            return None

    async def _observed(self, capture: _SGLangCapture) -> int | None:
        """Batches the capture recorded, from the forward counter (``None`` without one)."""
        count = await self._counter_or_none()
        if count is None or capture.begins is None:
            return None
        recorded = max(0, count - capture.begins + 1)
        limit = capture.window.forward_steps
        return recorded if limit is None else min(recorded, limit)

    async def _fields(self, window: Window) -> tuple[dict[str, object], str | None]:
        fields: dict[str, object] = {
            "output_dir": str(window.dir),
            # Both default to True on the server: set them explicitly.
            "with_stack": "stack" in self._contents,
            "record_shapes": "shapes" in self._contents,
            "profile_by_stage": False,
            "profile_id": window.prefix,
        }
        activities = {_SGLANG_ACTIVITIES[c] for c in self._contents if c in _SGLANG_ACTIVITIES}
        if activities:  # none named: the server's default (an empty list records nothing)
            fields["activities"] = sorted(activities)
        note = None
        start_step = None
        if window.delay:
            current = await self.forward_steps()
            if current is None:
                note = f"delay of {window.delay} not applied: no forward counter was given"
            else:
                # start_step counts batches since launch: skip `delay` batches from now.
                start_step = current + window.delay + 1
                fields["start_step"] = start_step
        if window.forward_steps is not None:
            steps = window.forward_steps
            if start_step is None and self._version < _SGLANG_EXACT_STEPS:
                steps += 1  # plain mode records num_steps - 1 batches before 0.5.20
            fields["num_steps"] = steps
        return fields, note

    async def _send_stop(self, capture: _SGLangCapture) -> bool:
        """Send the stop; True when the engine had already ended the capture itself."""
        try:
            await self._manager.stop_profile()
        except RuntimeError as exc:
            # "Profiling is not in progress": legitimate only for a capture told to end itself.
            if capture.scheduled and "not in progress" in str(exc):
                self._log.info("stop refused: the engine had already ended the capture")
                return True
            raise
        return False


def _profile_req(fields: dict[str, object]) -> Any:
    """A SGLang ``ProfileReq`` holding the ``fields`` this release knows."""
    cls = importlib.import_module("sglang.srt.managers.io_struct").ProfileReq
    names = getattr(cls, "__struct_fields__", None)  # msgspec Struct (0.5.15+)
    if names is None:
        names = [f.name for f in dataclasses.fields(cls)]
    return cls(**{k: v for k, v in fields.items() if k in names})


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _installed_version(package: str) -> str:
    try:
        version: str = importlib.import_module(package).__version__
    except (ImportError, AttributeError) as exc:
        raise VersionError(f"cannot tell the {package} version ({exc}): pass version=") from None
    return version


def _engine_profiler_dir(engine: Any) -> str | None:
    """The engine's torch trace folder (0.13+ config), else the era-A environment variable."""
    config = getattr(getattr(engine, "vllm_config", None), "profiler_config", None)
    folder = getattr(config, "torch_profiler_dir", None)
    return folder or os.environ.get("VLLM_TORCH_PROFILER_DIR")
