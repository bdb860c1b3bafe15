"""Continuous batching: requests join and leave a running batch, one forward per iteration.

The forward passes, and every profiler action, run on one dedicated engine thread, so the
event loop stays responsive and a capture records exactly the iterations it spans. One
iteration is one batched forward over the scheduled sequences; the forward-step counter
rises by one per iteration, and each forward is wrapped in a ``forward_step#<k>`` record.
While a profiler records, that record holds a ``requests: <id>,<id>,...`` record naming the
client request ids (``X-Request-Id``) of the sequences in the batch, so a merge can link each
request to the forward steps that served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import structlog

from aprof import AprofError

if TYPE_CHECKING:
    from servers.reference.model import TinyLM

logger = structlog.get_logger("servers.reference")

T = TypeVar("T")
MAX_CLIENT_ID = 128
"""The longest client request id a forward step names; a longer one is not named."""
MAX_NAMED_IDS = 64
"""Client ids named per forward step; the rest are counted (``(+N more)``)."""
REQUESTS_RECORD = "requests: "
"""How the record naming a forward step's client request ids begins."""
StepKind = Literal["prefill", "decode", "mixed"]


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One engine iteration, as the profilers and metrics see it."""

    number: int
    """The forward-step counter value of this iteration (1 for the first ever)."""
    kind: StepKind
    """Only new sequences (prefill), only running ones (decode), or both."""
    prefill_seqs: int
    prefill_tokens: int
    decode_seqs: int

    @property
    def tokens(self) -> int:
        """Tokens fed to the forward pass (prompt tokens of new sequences, one per decode)."""
        return self.prefill_tokens + self.decode_seqs


StepHook = Callable[[StepInfo], None]
"""Called on the engine thread before an iteration's forward; may block it (a trace export)."""


class SequenceFailed(AprofError):
    """The sequence ended unfinished: the engine shut down or its iteration failed."""


@dataclass(eq=False)
class Sequence:
    """One prompt being completed; its tokens arrive through :meth:`tokens`."""

    id: str
    prompt: list[int]
    max_tokens: int
    output: list[int] = field(default_factory=list)
    arrival_ns: int = field(default_factory=time.time_ns)
    finished_ns: int | None = None
    aborted: bool = False
    cache: Any = None
    """The model's key/value cache of this sequence; touched on the engine thread only."""
    client_id: str | None = None
    """The client's id of the request this sequence belongs to (``X-Request-Id``), if usable."""
    _queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)

    @property
    def finished(self) -> bool:
        """All ``max_tokens`` tokens were generated."""
        return len(self.output) >= self.max_tokens

    async def tokens(self) -> AsyncIterator[int]:
        """Each generated token id as its iteration ends; raises SequenceFailed when the
        sequence ends unfinished."""
        while True:
            token = await self._queue.get()
            if token is None:
                if not self.finished:
                    raise SequenceFailed(self.id)
                return
            yield token

    def abort(self) -> None:
        """Leave the batch at the next iteration (the client went away)."""
        self.aborted = True

    def _fail(self) -> None:
        self._queue.put_nowait(None)

    def _emit(self, token: int) -> None:
        self.output.append(token)
        self._queue.put_nowait(token)
        if self.finished:
            self.finished_ns = time.time_ns()
            self._queue.put_nowait(None)


class Engine:
    """The scheduler and model runner of one reference server."""

    def __init__(
        self,
        *,
        seed: int,
        separate_prefill: bool,
        annotate: Callable[[StepInfo], str] | None = None,
        max_running: int = 256,
    ) -> None:
        """``separate_prefill``: new sequences get their own prefill iteration (SGLang);
        otherwise they join the running decodes in one mixed iteration (vLLM).
        ``annotate`` names an extra record inside each forward (vLLM's iteration label)."""
        self._seed = seed
        self._separate_prefill = separate_prefill
        self._annotate = annotate
        self._max_running = max_running
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-engine")
        self._model: TinyLM | None = None
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self.forward_steps = 0
        """Iterations completed since the engine started."""
        self.step_hooks: list[StepHook] = []
        """Run before each forward, on the engine thread (profiler state machines)."""
        self.step_listeners: list[Callable[[StepInfo], None]] = []
        """Run after each iteration, on the event loop (metrics)."""
        self.finish_listeners: list[Callable[[Sequence], None]] = []
        """Run when a sequence finishes or is dropped, on the event loop."""

    @property
    def num_running(self) -> int:
        """Sequences in the running batch."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences not yet scheduled."""
        return len(self._waiting)

    def unfinished(self) -> list[Sequence]:
        """The sequences waiting or running now."""
        return [*self._waiting, *self._running]

    async def start(self) -> None:
        """Build the model on the engine thread and start iterating."""
        self._model = await self.call(self._build_model)
        self._task = asyncio.create_task(self._loop(), name="reference-engine")

    async def close(self) -> None:
        """Stop iterating, fail unfinished sequences, and release the engine thread."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [*self._waiting, *self._running]:
            seq._fail()
        self._waiting.clear()
        self._running.clear()
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    def submit(self, prompt: list[int], max_tokens: int, client_id: str | None = None) -> Sequence:
        """Queue one prompt; it joins the running batch at the next iteration.

        ``client_id`` (the client's request id) is named in the forward steps that serve the
        sequence when :func:`usable_client_id` accepts it."""
        seq = Sequence(
            id=f"seq-{next(self._ids)}",
            prompt=prompt,
            max_tokens=max_tokens,
            client_id=usable_client_id(client_id),
        )
        self._waiting.append(seq)
        self._wakeup.set()
        return seq

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine thread, between two iterations."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _build_model(self) -> TinyLM:
        from servers.reference.model import TinyLM

        return TinyLM(self._seed)

    def _schedule(self) -> tuple[list[Sequence], StepInfo | None]:
        self._drop_aborted()
        admitted: list[Sequence] = []
        while self._waiting and len(self._running) + len(admitted) < self._max_running:
            admitted.append(self._waiting.popleft())
        if self._separate_prefill and admitted:
            decoding: list[Sequence] = []
        else:
            decoding = list(self._running)
        self._running.extend(admitted)
        batch = admitted + decoding
        if not batch:
            return [], None
        kind: StepKind = "mixed" if admitted and decoding else "prefill" if admitted else "decode"
        info = StepInfo(
            number=self.forward_steps + 1,
            kind=kind,
            prefill_seqs=len(admitted),
            prefill_tokens=sum(len(seq.prompt) for seq in admitted),
            decode_seqs=len(decoding),
        )
        return batch, info

    def _drop_aborted(self) -> None:
        for seq in [s for s in (*self._waiting, *self._running) if s.aborted]:
            if seq in self._running:
                self._running.remove(seq)
            else:
                self._waiting.remove(seq)
            self._finished(seq)

    def _finished(self, seq: Sequence) -> None:
        seq.cache = None  # out of the batch for good: free its keys and values
        for listener in self.finish_listeners:
            listener(seq)

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            batch, info = self._schedule()
            if info is None:
                self._wakeup.clear()
                continue
            try:
                tokens = await self.call(functools.partial(self._iterate, batch, info))
            except Exception:
                # A failed forward fails its requests, not the server.
                logger.exception("engine iteration failed", step=info.number)
                self.forward_steps = info.number
                for seq in batch:
                    self._running.remove(seq)
                    seq._fail()
                    self._finished(seq)
                continue
            self.forward_steps = info.number
            for seq, token in zip(batch, tokens, strict=True):
                seq._emit(token)
                if seq.finished:
                    self._running.remove(seq)
                    self._finished(seq)
            for listener in self.step_listeners:
                listener(info)

    def _iterate(self, batch: list[Sequence], info: StepInfo) -> list[int]:
        import torch

        for hook in self.step_hooks:
            try:
                hook(info)
            except Exception:
                # As in the real engines, a profiler failure is logged, never fatal to serving.
                logger.exception("profiler step hook failed", step=info.number)
        assert self._model is not None
        with (
            torch.profiler.record_function(f"forward_step#{info.number}"),
            _record(torch, _requests_record(torch, batch)),
            _record(torch, self._annotate(info) if self._annotate else None),
        ):
            # A new sequence feeds its prompt, a running one its last token.
            inputs = [(seq.output[-1:] or seq.prompt, seq.cache) for seq in batch]
            results = self._model.step(inputs)
        for seq, (_, cache) in zip(batch, results, strict=True):
            seq.cache = cache
        return [token for token, _ in results]


def usable_client_id(value: object) -> str | None:
    """``value`` if a forward step can name it, else None: 1 to ``MAX_CLIENT_ID`` printable
    ASCII characters other than space, ``"``, ``\\`` and ``,``.

    Kineto writes a record's name into its JSON unescaped (a quote would break the whole trace
    file, a backslash becomes ``/``, other characters ``unknown``), and ``,`` separates ids."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_CLIENT_ID:
        return None
    if all("!" <= c <= "~" and c not in '"\\,' for c in value):
        return value
    return None


def _requests_record(torch: Any, batch: list[Sequence]) -> str | None:
    """``requests: a,b (+N more)`` for the batch's client ids, or None when no profiler
    records (the name is built each iteration: not for nothing) or no sequence has one."""
    if not getattr(torch.autograd.profiler, "_is_profiler_enabled", True):
        return None
    ids = list(dict.fromkeys(seq.client_id for seq in batch if seq.client_id))  # a request's
    if not ids:  # prompts share its id: named once
        return None
    more = len(ids) - MAX_NAMED_IDS
    named = REQUESTS_RECORD + ",".join(ids[:MAX_NAMED_IDS])
    return named + f" (+{more} more)" if more > 0 else named


def _record(torch: Any, name: str | None) -> contextlib.AbstractContextManager[object]:
    """A ``record_function`` named ``name``, or nothing without a name."""
    return torch.profiler.record_function(name) if name else contextlib.nullcontext()
