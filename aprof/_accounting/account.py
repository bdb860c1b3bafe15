"""What the accounting says of each step (:class:`StepAccount`, with its JSON names) and of
the run (:func:`summary`). Standard library only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

NS = 1e-9


@dataclass(frozen=True)
class Slow:
    """One of a step's slowest requests."""

    request_id: str | None
    replica: int
    latency_s: float
    process: str
    trajectory: str | None = None
    """The agent-loop run it is a turn of, when its client said (``req.trajectory``)."""
    turn: int | None = None
    """Which turn of it (0: the first), when its client said (``req.turn``)."""


@dataclass(frozen=True)
class ReplicaAccount:
    """One replica in one step."""

    replica: int
    busy_s: float
    """The union of its requests in flight within the step's span."""
    requests: int
    """Requests the step admitted to it."""
    tokens: int
    """The tokens they generated, as their clients reported them (``req.forward(tokens=...)``)."""
    prompt_tokens: int
    """Their prompts' tokens, where their clients knew them (``req.prompt_tokens``)."""
    tokens_per_s: float | None
    """``tokens / busy_s`` (generated tokens); ``None`` without tokens or busy time."""
    gated_wait_s: float
    """Summed over its gated requests: from each one's start until its capture was active."""


@dataclass(frozen=True)
class Anomaly:
    factor: float
    """The step's wall time over the median of its baseline."""
    phase: str
    """``rollout``, ``train`` or ``idle``: the one that grew most over its own median."""


@dataclass(frozen=True)
class StepAccount:
    """Where one step's time went."""

    step: int
    begin_ns: int
    end_ns: int
    profiled: bool
    rollout_s: float
    train_s: float
    overlap_s: float
    idle_s: float
    requests: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    tail_s: float | None
    tail_share: float | None
    """``tail_s`` over ``rollout_s``: how much of the rollout waited for the last 10%."""
    estimated: bool
    """More than ``MAX_VALUES`` requests: percentiles and tail from a uniform sample."""
    slowest: tuple[Slow, ...]
    replicas: tuple[ReplicaAccount, ...]
    imbalance: float | None
    """The busiest replica's ``busy_s`` over the mean; ``None`` without busy replicas."""
    staleness: dict[str, float] | None
    """``count``, ``mean``, ``max`` of the staleness the runner recorded (fully-async)."""
    anomaly: Anomaly | None = None

    @property
    def wall_s(self) -> float:
        return (self.end_ns - self.begin_ns) * NS

    def as_json(self) -> dict[str, Any]:
        """The step as ``aprof report --json`` prints it (names dashboards may rely on)."""
        wall = self.wall_s

        def share(value: float) -> float | None:
            return value / wall if wall > 0 else None

        return {
            "step": self.step,
            "wall_s": wall,
            "profiled": self.profiled,
            "begin_ns": self.begin_ns,
            "end_ns": self.end_ns,
            "phases": {
                "rollout_s": self.rollout_s,
                "train_s": self.train_s,
                "overlap_s": self.overlap_s,
                "idle_s": self.idle_s,
            },
            "shares": {
                "rollout": share(self.rollout_s),
                "train": share(self.train_s),
                "overlap": share(self.overlap_s),
                "idle": share(self.idle_s),
            },
            "requests": {
                "count": self.requests,
                "p50_s": self.p50_s,
                "p90_s": self.p90_s,
                "p99_s": self.p99_s,
                "max_s": self.max_s,
                "tail_s": self.tail_s,
                "tail_share": self.tail_share,
                "estimated": self.estimated,
                "slowest": [
                    {
                        "request_id": s.request_id,
                        "replica": s.replica,
                        "latency_s": s.latency_s,
                        "process": s.process,
                        "trajectory": s.trajectory,
                        "turn": s.turn,
                    }
                    for s in self.slowest
                ],
            },
            "replicas": [
                {
                    "replica": r.replica,
                    "busy_s": r.busy_s,
                    "requests": r.requests,
                    "tokens": r.tokens,
                    "prompt_tokens": r.prompt_tokens,
                    "tokens_per_s": r.tokens_per_s,
                    "gated_wait_s": r.gated_wait_s,
                }
                for r in self.replicas
            ],
            "imbalance": self.imbalance,
            "staleness": self.staleness,
            "anomaly": None
            if self.anomaly is None
            else {"factor": self.anomaly.factor, "phase": self.anomaly.phase},
        }


def summary(accounts: Iterable[StepAccount]) -> dict[str, Any]:
    """The run at a glance: steps, their wall time and each phase, summed over steps (steps
    never overlap, so these sums are wall time), and the anomalies."""
    steps = wall = rollout = train = overlap = idle = 0.0
    anomalies: list[int] = []
    for a in accounts:
        steps += 1
        wall += a.wall_s
        rollout += a.rollout_s
        train += a.train_s
        overlap += a.overlap_s
        idle += a.idle_s
        if a.anomaly is not None:
            anomalies.append(a.step)
    return {
        "steps": int(steps),
        "wall_s": wall,
        "rollout_s": rollout,
        "train_s": train,
        "overlap_s": overlap,
        "idle_s": idle,
        "anomalies": anomalies,
    }
