"""Raced requests: thousands of concurrent ``prof.request`` per step against faulty targets.

Eight ``RecordingTarget`` replicas fail, hang or lag at random steps (some bound their windows
themselves, some are polled); 30 steps, a random subset profiled, ``rollout.start`` both ways;
every step runs 4,000 concurrent requests (over 100,000 per run), some of which raise or are
cancelled, and some step bodies raise or are cancelled (at entry or midway). Everything is
drawn from a seeded generator, so a failure reproduces with its seed.

Afterwards: exactly one start and at most one stop per (step, target), a stop only after a
start that succeeded and every such start stopped, each window's ``requests`` counts equal to
what its requests saw (``req.gated``, ``req.captured``), only the planned exceptions out of
steps and requests, no task left pending, and the manifest read back equal to the live one.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import aprof
from faults.common import LedgerTarget, check_stops, check_windows, load, same_windows
from faults.tally import Faults

pytestmark = pytest.mark.faults

STEPS = 30
"""Steps per run; 18 plain, 4 whose body raises, 4 cancelled at entry, 4 midway."""
REPLICAS = 8
PER_STEP = 4000
RUN_S = 120.0
"""Bound on one whole run."""


class StepBodyError(Exception):
    """Raised by a step body on purpose."""


class RequestBodyError(Exception):
    """Raised inside a request on purpose."""


@dataclass
class Planned:
    """What one request will do, drawn before it runs."""

    replica: int
    raises: bool
    cancelled: bool
    advances: bool


def faulty_target(rng: random.Random, replica: int | None, role: str = "") -> LedgerTarget:
    """A replica (or, without one, a worker role) that fails, hangs or lags at random steps."""

    def some(p: float) -> set[int]:
        return {n for n in range(1, STEPS + 1) if rng.random() < p}

    kind = "rollout" if replica is not None else "role"
    extra: dict[str, object] = {"rank": 0} if role == "actor" else {}
    return LedgerTarget(
        f"replica_{replica}" if replica is not None else role,
        kind=kind,
        replica=replica,
        **extra,
        enforces_window=rng.random() < 0.5,
        # The last replica and the roles stay stuck after a failed stop, as a plain one does.
        ends_on_failed_stop=replica is not None and replica < REPLICAS - 1,
        fail_start=some(0.1),
        fail_stop=some(0.1),
        hang_start=some(0.05),
        hang_stop=some(0.05),
        start_latency=rng.choice([0.0, 0.0, 0.001, 0.01]),
        stop_latency=rng.choice([0.0, 0.0, 0.001, 0.02]),
    )


@pytest.mark.parametrize(("start", "seed"), [("on_first_request", 1), ("on_step", 2)])
async def test_raced_requests(tmp_path: Path, faults: Faults, start: str, seed: int) -> None:
    """30 steps of 4,000 concurrent requests over 8 faulty replicas (and two faulty worker
    roles): every capture started once and stopped once, request counts exact, nothing but
    the planned exceptions out."""
    rng = random.Random(seed)
    targets = [faulty_target(rng, r) for r in range(REPLICAS)]
    roles = [faulty_target(rng, None, "actor"), faulty_target(rng, None, "critic")]
    profiled = sorted(rng.sample(range(1, STEPS + 1), k=rng.randint(10, 20)))
    prof = aprof.Profiler(
        {
            "global_profiler": {
                "steps": profiled,
                "save_path": str(tmp_path / "profile"),
                "continuous": rng.random() < 0.5,
                "wait_for_stops": rng.random() < 0.5,
            },
            "rollout": {
                "replicas": "all",
                "start": start,
                "delay": rng.choice([0, 1]),
                "forward_steps": rng.choice([3, None]),
            },
            "roles": {"actor": {"ranks": [0]}, "critic": {}},
            "timeouts": {"connect_s": 0.2, "start_s": 0.2, "stop_s": 0.2, "poll_s": 0.005},
            "log": {"level": "error"},
        }
    )
    for target in targets + roles:
        prof.add_target(target)
    entered: list[aprof.Request] = []
    """Every request whose ``__aenter__`` ran."""
    outcomes: Counter[str] = Counter()

    async def request(n: int, i: int, plan: Planned) -> None:
        req = prof.request(replica=plan.replica, request_id=f"{n}-{i}")
        entered.append(req)
        async with req:
            if plan.advances:
                targets[plan.replica].advance(1)
            await asyncio.sleep(0)
            if plan.raises:
                raise RequestBodyError(n, i)

    def check_request(task: asyncio.Task[None], plan: Planned, step_cancelled: bool) -> None:
        if task.cancelled():
            ok = plan.cancelled or step_cancelled
            outcomes["cancelled"] += 1
            faults.check("escaped", ok, f"{task.get_name()}: cancelled, unplanned")
            return
        exc = task.exception()
        if exc is None:
            outcomes["ok"] += 1
            faults.check("escaped", not plan.raises, f"{task.get_name()}: its error was lost")
        else:
            outcomes["raised"] += 1
            ok = isinstance(exc, RequestBodyError) and plan.raises
            faults.check("escaped", ok, f"{task.get_name()}: {type(exc).__name__}: {exc}")

    async def run_step(
        n: int, kind: str, halfway: asyncio.Event, tasks: dict[asyncio.Task[None], Planned]
    ) -> None:
        """Step ``n``: all its requests at once, as tasks put into ``tasks``."""
        plans = [
            Planned(
                replica=rng.randrange(REPLICAS),
                raises=rng.random() < 0.01,
                cancelled=rng.random() < 0.02,
                advances=rng.random() < 0.05,
            )
            for _ in range(PER_STEP)
        ]
        cut_at = rng.randrange(PER_STEP)
        async with prof.step(n):
            loop = asyncio.get_running_loop()
            for i, plan in enumerate(plans):
                tasks[loop.create_task(request(n, i, plan), name=f"step {n} request {i}")] = plan
            # One pass of the loop: most requests are in prof.request (many gated) when
            # the cancellations below come; any moment is fair, this one is the busiest.
            await asyncio.sleep(0)
            for task, plan in tasks.items():
                if plan.cancelled:
                    task.cancel()
            if kind == "cancel_body":
                await asyncio.wait(list(tasks)[: cut_at + 1])
                halfway.set()
            elif kind == "raise":
                await asyncio.wait(list(tasks)[: cut_at + 1])
                raise StepBodyError(n)
            await asyncio.gather(*tasks, return_exceptions=True)

    async with asyncio.timeout(RUN_S):
        async with prof:
            kinds = ["ok"] * 18 + ["raise", "cancel_enter", "cancel_body"] * 4
            rng.shuffle(kinds)
            for n, kind in enumerate(kinds, start=1):
                halfway = asyncio.Event()
                tasks: dict[asyncio.Task[None], Planned] = {}
                stepping = asyncio.create_task(run_step(n, kind, halfway, tasks), name=f"step {n}")
                if kind == "cancel_enter":
                    await asyncio.sleep(0)  # one pass: the step task is entering the step
                    stepping.cancel()
                elif kind == "cancel_body":
                    waiter = asyncio.ensure_future(halfway.wait())
                    await asyncio.wait({stepping, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stepping.cancel()
                await asyncio.wait({stepping})
                if tasks:
                    await asyncio.wait(tasks)  # requests the step's end left running
                if stepping.cancelled():
                    faults.check("escaped", kind.startswith("cancel"), f"step {n} cancelled")
                else:
                    exc = stepping.exception()
                    ok = (exc is None and kind != "raise") or (
                        isinstance(exc, StepBodyError) and kind == "raise"
                    )
                    faults.check("escaped", ok, f"step {n} ({kind}): {exc!r}")
                for task, plan in tasks.items():
                    check_request(task, plan, stepping.cancelled())
        # Starts, stops and polls run in tasks of their own: none is left once closed.
        pending = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert not pending, f"tasks left pending after close: {pending}"

    faults.count("requests", len(entered))
    assert len(entered) > 60_000, outcomes  # steps cancelled at entry send none

    # Every profiled step has one window per replica; unprofiled steps none.
    manifest = load(faults, prof.save_path)
    check_windows(faults, manifest)
    assert same_windows(prof.manifest, manifest), "the manifest read back differs"
    windows = {(w.step, w.target): w for w in prof.manifest.windows if w.kind == "rollout"}
    assert set(windows) == {(n, f"replica_{r}") for n in profiled for r in range(REPLICAS)}
    # A role window begins at each profiled step (or, continuous, at each run's first).
    for role in roles:
        begins = [w.step for w in prof.manifest.windows if w.target == role.name]
        assert len(set(begins)) == len(begins), role.name
        if prof.config.global_profiler.continuous:
            assert set(begins) <= set(profiled), role.name
        else:
            assert set(begins) == set(profiled), role.name

    # Exactly once, and a stop only for a capture that started.
    for target in targets + roles:
        breaches = check_stops(faults, target)
        assert not breaches, breaches
        assert {w.step for w in target.starts} <= set(profiled)

    # What each window counted is what its requests saw.
    seen: Counter[tuple[int | None, int, str]] = Counter()
    for req in entered:
        if req.gated or req.captured:
            seen[req.step, req.replica, "admitted"] += 1
        if req.gated:
            seen[req.step, req.replica, "gated"] += 1
    for (step, name), record in windows.items():
        replica = int(name.removeprefix("replica_"))
        counted = (record.requests.admitted, record.requests.gated)
        expected = (seen[step, replica, "admitted"], seen[step, replica, "gated"])
        assert counted == expected, f"step {step} {name}: counted {counted}, saw {expected}"
    unwindowed = {(s, r) for s, r, _ in seen} - {
        (s, int(t.removeprefix("replica_"))) for s, t in windows
    }
    assert not unwindowed, f"requests gated or captured without a window: {unwindowed}"
    assert outcomes["raised"] and outcomes["cancelled"], outcomes
    faults.assert_nothing_lost()
