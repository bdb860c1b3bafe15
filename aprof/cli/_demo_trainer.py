"""The trainer of ``aprof demo``: a tiny character policy updated on CPU, in a process of its own.

It is real torch work (forward, backward, optimizer steps), small enough for a laptop, and it
runs inside the ``trainer`` role's capture so the demo shows an engine-worker trace beside the
rollout traces. Like an engine worker of a real trainer it runs in its own process, reached
through the ``aprof.WorkerHandle`` interface (``begin``, ``end``) plus the demo's ``update``.

That process's stdout and stderr (file descriptors 1 and 2, where torch's C++ writes) go to a
log file, not the terminal: torch prints lines there that are not failures of the demo, such as
``USDT: ... profiler_start`` and ``profiler_stop``, the profiler's ``ERROR: External init
callback must run in same thread as registerClient`` and, without NumPy, a ``UserWarning:
Failed to initialize NumPy``. aprof's own warnings of that process go there too.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from aprof import (
    LocalWorker,
    ProfilerConfig,
    WorkerCapture,
    WorkerProfiler,
    WorkerTimeline,
    configure_logging,
)

if TYPE_CHECKING:
    import torch

VOCAB = 128  # byte values below 128: the reference server's alphabet is printable ASCII
CONTEXT = 8
MINI_BATCHES = 4


class Trainer:
    """A character-level policy over ``CONTEXT`` previous characters, trained by REINFORCE.

    ``update(texts, rewards)`` is one global step's training: ``MINI_BATCHES`` optimizer
    steps, each a ``mini_batch<i>`` range and one ``wp.step()`` of the profiler's schedule.
    """

    def __init__(self, profiler: WorkerProfiler, *, seed: int = 0) -> None:
        import torch
        from torch import nn

        torch.manual_seed(seed)
        self.profiler = profiler
        self.model = nn.Sequential(
            nn.Embedding(VOCAB, 32),
            nn.Flatten(),
            nn.Linear(32 * CONTEXT, 128),
            nn.ReLU(),
            nn.Linear(128, VOCAB),
        )
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.losses: list[float] = []

    def update(self, texts: Sequence[str], rewards: Sequence[float]) -> float:
        """Train on ``texts`` weighted by ``rewards``; the mean loss of the step."""
        import torch

        contexts, targets, weights = _examples(texts, rewards)
        if contexts.shape[0] == 0:
            return 0.0
        losses = []
        with self.profiler.stage("update_policy"):
            for i, part in enumerate(torch.arange(contexts.shape[0]).chunk(MINI_BATCHES)):
                with torch.profiler.record_function(f"mini_batch{i}"):
                    logits = self.model(contexts[part])
                    nll = torch.nn.functional.cross_entropy(logits, targets[part], reduction="none")
                    loss = (nll * weights[part]).mean()
                    torch.autograd.backward(loss)
                    self.optim.step()
                    self.optim.zero_grad()
                losses.append(float(loss.detach()))
                self.profiler.step()
        mean = sum(losses) / len(losses)
        self.losses.append(mean)
        return mean


def _examples(
    texts: Sequence[str], rewards: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(context, next character, advantage) for every character of every text."""
    import torch

    baseline = sum(rewards) / len(rewards) if rewards else 0.0
    contexts: list[list[int]] = []
    targets: list[int] = []
    weights: list[float] = []
    for text, reward in zip(texts, rewards, strict=True):
        codes = [min(ord(c), VOCAB - 1) for c in text]
        padded = [0] * CONTEXT + codes
        for i, code in enumerate(codes):
            contexts.append(padded[i : i + CONTEXT])
            targets.append(code)
            weights.append(reward - baseline + 1.0)  # kept positive: a stand-in advantage
    return (
        torch.tensor(contexts, dtype=torch.long).reshape(-1, CONTEXT),
        torch.tensor(targets, dtype=torch.long),
        torch.tensor(weights, dtype=torch.float32),
    )


class TrainerProcess:
    """The ``Trainer`` in a process of its own whose output goes to ``log``; the
    ``aprof.WorkerHandle`` of its one rank (rank 0 of the ``trainer`` role).

    Every call runs on that process's one thread, as torch's profiler wants. The process
    starts (and imports torch) when this object is made; ``ready()`` waits for it. Leaving
    the ``with`` block waits for the call in progress, then ends the process.
    """

    rank = 0

    def __init__(self, config: ProfilerConfig, log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        self._pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("spawn"),  # no fork of a threaded loop
            initializer=_start,
            initargs=(config, log),
        )
        self._started: Future[None] = self._pool.submit(_ready)

    def __enter__(self) -> TrainerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown()

    async def ready(self) -> None:
        """Wait until the process is up and its trainer built; raises BrokenProcessPool if not."""
        await asyncio.wrap_future(self._started)

    async def begin(self, step: int) -> None:
        """Open the trainer's window at global step ``step``."""
        await asyncio.get_running_loop().run_in_executor(self._pool, _begin, step)

    async def end(self) -> list[WorkerCapture]:
        """Close the window; the captures it made."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, _end)

    async def timeline(self) -> WorkerTimeline | None:
        """The trainer's timeline, with its ``update_policy`` stages."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, _timeline)

    async def update(self, texts: Sequence[str], rewards: Sequence[float]) -> float:
        """One global step's training (see ``Trainer.update``); the mean loss."""
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, _update, list(texts), list(rewards)
        )


# In the trainer's process: built by _start, used by the calls that follow.
_worker: LocalWorker | None = None
_trainer: Trainer | None = None


def _start(config: ProfilerConfig, log: Path) -> None:
    global _worker, _trainer
    # Ctrl-C is the demo's to handle: it stops the windows (which calls in here), then us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    configure_logging(config.log.format, config.log.level)
    profiler = WorkerProfiler(config, role="trainer", rank=0, world_size=1)
    _worker = LocalWorker(profiler)
    _trainer = Trainer(profiler)


def _ready() -> None:
    pass  # the initializer did the work


def _begin(step: int) -> None:
    assert _worker is not None
    _worker.begin_step(step)


def _end() -> list[WorkerCapture]:
    assert _worker is not None
    return _worker.end_step()


def _timeline() -> WorkerTimeline | None:
    assert _worker is not None
    return _worker.profiler.hand_over_timeline()


def _update(texts: list[str], rewards: list[float]) -> float:
    assert _trainer is not None
    return _trainer.update(texts, rewards)
