"""The trainer of ``aprof demo``: a tiny character policy updated on CPU from the rollouts.

It is real torch work (forward, backward, optimizer steps), small enough for a laptop, and it
runs inside the ``trainer`` role's capture so the demo shows an engine-worker trace beside the
rollout traces. Torch is imported when the trainer is built, not when the CLI starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aprof._worker import WorkerProfiler

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
