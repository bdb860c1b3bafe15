"""The ledger: a run's spans from any number of processes, merged into unions as they come;
what each step's account is made of; plain data to carry a ledger between processes.
Standard library only."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aprof._accounting.account import NS, Anomaly, ReplicaAccount, Slow, StepAccount
from aprof._accounting.intervals import (
    RollingMedian,
    Union,
    intervals,
    nearest_rank,
    packed,
    unpack,
)

MAX_VALUES = 4096
"""Latencies kept per step; beyond, a uniform sample of them."""
SLOWEST = 5
"""The slowest requests named per step."""
TAIL = 0.9
"""``tail_s`` begins once this share of the step's requests have ended."""
FACTOR = 2.0
"""A step this many times the median of its baseline is an anomaly (unless the run's
``triggers.slow_step`` says otherwise)."""
BASELINE = 10
"""Unprofiled steps the median is taken over (unless ``triggers.slow_step`` says otherwise)."""
MIN_BASELINE = 3
"""Fewer previous unprofiled steps than this: no step is judged yet."""
LEDGER_SUFFIX = ".ledger.jsonl"
"""A timeline's ledgers: ``timeline/<process>.ledger.jsonl``, one line per write."""
STAGE = "stage"
"""The ``aprof`` attr of a timeline span that is a trainer stage (``prof.stage(name)``)."""


@dataclass
class _Replica:
    requests: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    gated_begins: array[int] = field(default_factory=lambda: array("q"))


@dataclass
class _Step:
    """What a step admitted: its requests' latencies and ends, kept up to ``MAX_VALUES``."""

    seen: int = 0
    latencies: array[float] = field(default_factory=lambda: array("d"))
    ends: array[int] = field(default_factory=lambda: array("q"))
    max_s: float = 0.0
    last_end: int = 0
    slowest: list[tuple[float, int, str | None, int, str, str | None, int | None]] = field(
        default_factory=list
    )
    """The slowest requests, a heap: latency, order taken (ties), request id, replica,
    process, trajectory, turn."""
    replicas: dict[int, _Replica] = field(default_factory=dict)
    staleness: list[float] = field(default_factory=list)


def _finite(value: object, *, low: float = 0.0) -> float:
    """``value`` as a finite float of at least ``low``; raises ``ValueError`` otherwise."""
    found = float(value)  # type: ignore[arg-type]  # anything else raises, as it should
    if not (math.isfinite(found) and found >= low):
        raise ValueError(f"not a finite number >= {low:g}: {value!r}")
    return found


def _count(value: object) -> int:
    """``value`` as an int >= 0 (no bool); raises ``ValueError`` otherwise."""
    if type(value) is not int or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _step_of(fields: Any) -> _Step:
    """One step of a ledger's plain data, checked: finite latencies, counts >= 0."""
    seen, latencies, ends, max_s, last_end, slowest, replicas, stale = fields
    part = _Step(seen=_count(seen), max_s=_finite(max_s), last_end=int(last_end))
    unpack(part.latencies, latencies)
    unpack(part.ends, ends)
    # A sum is finite only when no value is NaN or infinite; then min() is exact.
    if part.latencies and not (math.isfinite(sum(part.latencies)) and min(part.latencies) >= 0):
        raise ValueError("a latency that is not a finite number >= 0")
    if len(part.ends) != len(part.latencies) or len(part.latencies) > min(seen, MAX_VALUES):
        raise ValueError("latencies and ends do not match the requests")
    part.slowest = [
        (
            _finite(lat),
            0,
            rid if isinstance(rid, str) else None,
            int(r),
            str(proc),
            traj if isinstance(traj, str) else None,
            turn if type(turn) is int else None,
        )
        for lat, rid, r, proc, traj, turn in list(slowest)[:SLOWEST]
    ]
    for r, (requests, tokens, prompt_tokens, gated) in dict(replicas).items():
        counts = _Replica(_count(requests), _count(tokens), _count(prompt_tokens))
        part.replicas[int(r)] = counts
        unpack(counts.gated_begins, gated)
    part.staleness = [_finite(v, low=-math.inf) for v in list(stale)[:MAX_VALUES]]
    return part


def _checked(plain: Any) -> Ledger:
    """A ledger holding :meth:`Ledger.take`'s ``plain``, checked whole (raises otherwise)."""
    walls, steps, rollout, train, busy, started = plain
    found = Ledger()
    found._walls = {int(n): (int(b), int(e), bool(p)) for n, (b, e, p) in dict(walls).items()}
    for key, when in dict(started).items():
        step, _, replica = str(key).partition(":")
        found._started[int(step), int(replica)] = int(when)
    found._steps = {int(n): _step_of(fields) for n, fields in dict(steps).items()}
    found._rollout.extend(intervals(rollout))
    found._train.extend(intervals(train))
    for r, pairs in dict(busy).items():
        found._busy[int(r)] = Union()
        found._busy[int(r)].extend(intervals(pairs))
    return found


def ledger_file(process: str) -> str:
    """The name of the file beside a process's timeline holding its writes' ledgers."""
    return process + LEDGER_SUFFIX


class Ledger:
    """A run's spans from every process, taken in any order; :meth:`accounts` says where each
    step's time went.

    A process's ledger travels as :meth:`take`'s plain data (marshal and pickle carry it),
    which another ledger :meth:`merge` s: a live run's driver keeps one of every process's.
    """

    def __init__(self) -> None:
        self._walls: dict[int, tuple[int, int, bool]] = {}
        self._steps: dict[int, _Step] = {}
        self._rollout = Union()
        self._train = Union()
        self._busy: dict[int, Union] = {}
        self._started: dict[tuple[int, int], int] = {}
        self._order = itertools.count()
        self._random = random.Random(0)  # a sample, not a secret

    # -- taking spans -------------------------------------------------------------------------

    def step(self, n: int, begin_ns: int, end_ns: int, *, profiled: bool) -> None:
        """The driver's span of global step ``n`` (the first one given counts)."""
        if end_ns >= begin_ns:
            self._walls.setdefault(n, (begin_ns, end_ns, profiled))

    def request(
        self,
        begin_ns: int,
        end_ns: int,
        *,
        step: int | None,
        replica: int,
        request_id: str | None,
        tokens: int,
        prompt_tokens: int,
        gated: bool,
        process: str,
        trajectory: str | None = None,
        turn: int | None = None,
    ) -> None:
        """One request span; ``step``: the step it was admitted in; ``tokens``: those it
        generated, ``prompt_tokens``: its prompt's (0: not known); ``trajectory`` and
        ``turn``: the agent-loop run and turn it is, when known."""
        if end_ns < begin_ns:
            return
        self._rollout.add(begin_ns, end_ns)
        busy = self._busy.get(replica)
        if busy is None:
            busy = self._busy[replica] = Union()
        busy.add(begin_ns, end_ns)
        if step is None:
            return
        mine = self._steps.get(step)
        if mine is None:
            mine = self._steps[step] = _Step()
        latency = (end_ns - begin_ns) * NS
        mine.seen += 1
        if len(mine.latencies) < MAX_VALUES:
            mine.latencies.append(latency)
            mine.ends.append(end_ns)
        else:  # Algorithm R: every request equally likely to be kept
            slot = self._random.randrange(mine.seen)
            if slot < MAX_VALUES:
                mine.latencies[slot], mine.ends[slot] = latency, end_ns
        mine.max_s = max(mine.max_s, latency)
        mine.last_end = max(mine.last_end, end_ns)
        entry = (latency, next(self._order), request_id, replica, process, trajectory, turn)
        if len(mine.slowest) < SLOWEST:
            heapq.heappush(mine.slowest, entry)
        elif latency > mine.slowest[0][0]:
            heapq.heapreplace(mine.slowest, entry)
        counts = mine.replicas.get(replica)
        if counts is None:
            counts = mine.replicas[replica] = _Replica()
        counts.requests += 1
        counts.tokens += max(0, tokens)
        counts.prompt_tokens += max(0, prompt_tokens)
        if gated:
            counts.gated_begins.append(begin_ns)

    def stage(self, begin_ns: int, end_ns: int) -> None:
        """A trainer stage span (any role, any rank)."""
        self._train.add(begin_ns, end_ns)

    def capture_started(self, step: int, replica: int, when_ns: int) -> None:
        """When replica ``replica``'s capture of ``step`` was active (its start had ended)."""
        self._started.setdefault((step, replica), when_ns)

    def span(
        self, begin_ns: int, end_ns: int, attrs: Mapping[str, object], step: int | None
    ) -> None:
        """A timeline span with its attrs, as the accounting reads one: a trainer stage when
        its ``aprof`` attr is ``stage``; a trajectory's staleness when its ``staleness`` attr
        is a finite number (no bool), counted in its ``step`` attr's step, else ``step``."""
        if attrs.get("aprof") == STAGE:
            self.stage(begin_ns, end_ns)
        stale, used_in = attrs.get("staleness"), attrs.get("step", step)
        if type(used_in) is not int:
            return
        if (type(stale) is int and abs(stale) < 1 << 53) or (
            type(stale) is float and math.isfinite(stale)
        ):
            self.staleness(used_in, float(stale))

    def staleness(self, step: int, steps: float) -> None:
        """A trajectory the trainer used in ``step`` was admitted ``steps`` steps before."""
        mine = self._steps.get(step)
        if mine is None:
            mine = self._steps[step] = _Step()
        if len(mine.staleness) < MAX_VALUES:
            mine.staleness.append(steps)

    def take(self) -> tuple[Any, ...]:
        """What this ledger holds, as plain data (tuples, dicts with int or str keys, str,
        numbers: marshal and JSON carry it; arrays as base64 of their bytes, in this
        machine's byte order; ``()`` when it holds nothing); the ledger is empty afterwards."""
        if not (self._walls or self._steps or self._started or self._busy) and not (
            len(self._rollout) or len(self._train)
        ):
            return ()
        steps = {
            n: (
                m.seen,
                packed(m.latencies),
                packed(m.ends),
                m.max_s,
                m.last_end,
                [entry[:1] + entry[2:] for entry in m.slowest],
                {
                    r: (c.requests, c.tokens, c.prompt_tokens, packed(c.gated_begins))
                    for r, c in m.replicas.items()
                },
                list(m.staleness),
            )
            for n, m in self._steps.items()
        }
        plain = (
            dict(self._walls),
            steps,
            self._rollout.plain(),
            self._train.plain(),
            {r: u.plain() for r, u in self._busy.items()},
            {f"{s}:{r}": when for (s, r), when in self._started.items()},
        )
        self._clear()
        return plain

    def _clear(self) -> None:
        self._walls, self._steps, self._started = {}, {}, {}
        self._rollout, self._train, self._busy = Union(), Union(), {}

    def merge(self, plain: Any) -> None:
        """Take in another ledger's :meth:`take`. Raises (``ValueError``, ``TypeError``,
        ``OverflowError``...) on anything else, a number that is not finite or a negative
        count among them, before taking any of it."""
        if plain:
            self.absorb(_checked(plain))

    def absorb(self, other: Ledger) -> None:
        """Take in everything ``other`` holds; ``other`` is empty afterwards."""
        for n, (b, e, p) in other._walls.items():
            self.step(n, b, e, profiled=p)
        for key, when in other._started.items():
            self.capture_started(*key, when)
        other.settle()
        self._rollout.extend(other._rollout.intervals())
        self._train.extend(other._train.intervals())
        for r, union in other._busy.items():
            self._busy.setdefault(r, Union()).extend(union.intervals())
        for n, part in other._steps.items():
            self._merge_step(n, part)
        # Many ledgers' intervals must not pile up unmerged, nor be merged over and over.
        for union in (self._rollout, self._train, *self._busy.values()):
            union.tidy()
        other._clear()  # its parts are this ledger's now

    def _merge_step(self, n: int, part: _Step) -> None:
        mine = self._steps.get(n)
        if mine is None:
            part.slowest = [(e[0], next(self._order), *e[2:]) for e in part.slowest]
            heapq.heapify(part.slowest)
            self._steps[n] = part
            return
        mine.seen += part.seen
        room = MAX_VALUES - len(mine.latencies)
        mine.latencies.extend(part.latencies[:room])
        mine.ends.extend(part.ends[:room])
        mine.max_s = max(mine.max_s, part.max_s)
        mine.last_end = max(mine.last_end, part.last_end)
        for latency, _, rid, r, proc, trajectory, turn in part.slowest:
            entry = (latency, next(self._order), rid, r, proc, trajectory, turn)
            if len(mine.slowest) < SLOWEST:
                heapq.heappush(mine.slowest, entry)
            elif latency > mine.slowest[0][0]:
                heapq.heapreplace(mine.slowest, entry)
        for r, counts in part.replicas.items():
            have = mine.replicas.setdefault(r, _Replica())
            have.requests += counts.requests
            have.tokens += counts.tokens
            have.prompt_tokens += counts.prompt_tokens
            have.gated_begins.extend(counts.gated_begins)
        mine.staleness.extend(part.staleness[: MAX_VALUES - len(mine.staleness)])

    def account(self, n: int) -> StepAccount | None:
        """Step ``n`` as far as this ledger knows it (no anomaly is judged), or ``None``
        without its span; nothing is let go of."""
        wall = self._walls.get(n)
        if wall is None:
            return None
        self.settle()
        both = self._rollout & self._train
        return self._account(n, *wall, both, self._steps.get(n))

    def steps_held(self) -> set[int]:
        """The steps this ledger holds anything of: a span, a request, a capture start."""
        return {*self._walls, *self._steps, *(step for step, _ in self._started)}

    def latencies(self) -> Iterator[tuple[int, array[float], int]]:
        """Per step that admitted requests, in step order: the latencies kept (s; all of
        them, or a uniform sample of ``MAX_VALUES`` when there were more) and how many
        there were."""
        for n in sorted(self._steps):
            mine = self._steps[n]
            if mine.seen:
                yield n, mine.latencies, mine.seen

    def last_step(self) -> int | None:
        """The latest step with a span."""
        return max(self._walls, default=None)

    def newest(self) -> int | None:
        """The latest step anything was taken of."""
        return max((*self._walls, *self._steps), default=None)

    def forget_before(self, n: int) -> None:
        """Let go of the steps before ``n`` and of the intervals that ended before the
        earliest step kept began (a live run's ledger stays small)."""
        for old in [s for s in self._walls if s < n]:
            del self._walls[old]
        for old in [s for s in self._steps if s < n]:
            del self._steps[old]
        for key in [k for k in self._started if k[0] < n]:
            del self._started[key]
        if self._walls:
            since = min(begin for begin, _, _ in self._walls.values())
            self._rollout.forget_before(since)
            self._train.forget_before(since)
            for busy in self._busy.values():
                busy.forget_before(since)

    def settle(self) -> None:
        """Merge the intervals taken so far (call after each input: memory stays small)."""
        self._rollout.settle()
        self._train.settle()
        for busy in self._busy.values():
            busy.settle()

    # -- accounting ---------------------------------------------------------------------------

    def accounts(self, factor: float = FACTOR, baseline: int = BASELINE) -> Iterator[StepAccount]:
        """Each step with a span, in step order, as its account; steps whose values are used
        are let go of as they are given out."""
        self.settle()
        both = self._rollout & self._train
        medians = {phase: RollingMedian(baseline) for phase in ("wall", "rollout", "train", "idle")}
        for n in sorted(self._walls):
            begin, end, profiled = self._walls[n]
            account = self._account(n, begin, end, profiled, both, self._steps.pop(n, None))
            values = {
                "wall": account.wall_s,
                "rollout": account.rollout_s,
                "train": account.train_s,
                "idle": account.idle_s,
            }
            if not profiled:
                median = medians["wall"].median()
                if (
                    median is not None
                    and median > 0
                    and len(medians["wall"]) >= min(MIN_BASELINE, baseline)
                    and account.wall_s > factor * median
                ):
                    account = _with_anomaly(account, account.wall_s / median, values, medians)
                for phase, value in values.items():
                    medians[phase].add(value)
            yield account

    def _account(
        self,
        n: int,
        begin: int,
        end: int,
        profiled: bool,
        both: Union,
        mine: _Step | None,
    ) -> StepAccount:
        wall = end - begin
        rollout = self._rollout.covered(begin, end)
        train = self._train.covered(begin, end)
        overlap = both.covered(begin, end)
        idle = wall - rollout - train + overlap
        mine = mine or _Step()
        ordered = sorted(mine.latencies)
        p50 = p90 = p99 = tail = share = None
        if ordered:
            p50, p90, p99 = (nearest_rank(ordered, p) for p in (50, 90, 99))
            ends = sorted(mine.ends)
            tail = max(0.0, (mine.last_end - nearest_rank(ends, TAIL * 100)) * NS)
            share = min(1.0, tail / (rollout * NS)) if rollout > 0 else None
        replicas = []
        busy_ns = {r: u.covered(begin, end) for r, u in self._busy.items()}
        for r in sorted(set(mine.replicas) | {r for r, ns in busy_ns.items() if ns}):
            counts = mine.replicas.get(r, _Replica())
            busy = busy_ns.get(r, 0) * NS
            started = self._started.get((n, r))
            waited = 0.0
            if started is not None:
                waited = sum(max(0, started - b) for b in counts.gated_begins) * NS
            replicas.append(
                ReplicaAccount(
                    replica=r,
                    busy_s=busy,
                    requests=counts.requests,
                    tokens=counts.tokens,
                    prompt_tokens=counts.prompt_tokens,
                    tokens_per_s=counts.tokens / busy if counts.tokens and busy > 0 else None,
                    gated_wait_s=waited,
                )
            )
        busy_all = [r.busy_s for r in replicas if r.busy_s > 0]
        imbalance = max(busy_all) / (sum(busy_all) / len(busy_all)) if busy_all else None
        stale = mine.staleness
        return StepAccount(
            step=n,
            begin_ns=begin,
            end_ns=end,
            profiled=profiled,
            rollout_s=rollout * NS,
            train_s=train * NS,
            overlap_s=overlap * NS,
            idle_s=idle * NS,
            requests=mine.seen,
            p50_s=p50,
            p90_s=p90,
            p99_s=p99,
            max_s=mine.max_s if mine.seen else None,
            tail_s=tail,
            tail_share=share,
            estimated=mine.seen > len(mine.latencies),
            slowest=tuple(
                Slow(rid, replica, latency, process, trajectory, turn)
                for latency, _, rid, replica, process, trajectory, turn in sorted(
                    mine.slowest, reverse=True
                )
            ),
            replicas=tuple(replicas),
            imbalance=imbalance,
            staleness=None
            if not stale
            else {"count": len(stale), "mean": sum(stale) / len(stale), "max": max(stale)},
        )


def _with_anomaly(
    account: StepAccount,
    factor: float,
    values: dict[str, float],
    medians: dict[str, RollingMedian],
) -> StepAccount:
    growth = {
        phase: values[phase] - (medians[phase].median() or 0.0)
        for phase in ("rollout", "train", "idle")
    }
    phase = max(growth, key=lambda p: growth[p])
    return replace(account, anomaly=Anomaly(factor=factor, phase=phase))


def combined(first: Any, second: Any, keep: int) -> tuple[Any, ...]:
    """Two ledgers' plain data as one, without the steps older than the newest ``keep``."""
    ledger = Ledger()
    for plain in (first, second):
        if plain:
            ledger.merge(plain)
    newest = ledger.newest()
    if newest is not None:
        ledger.forget_before(newest - keep + 1)
    return ledger.take()
