"""Generated programs of steps, racing requests and faulty targets against the Profiler.

Each hypothesis example is one *program*: a step selection, the global steps the driver enters,
rollout replicas (and maybe a role target) with random latencies and faults, and per step a
crowd of request coroutines, some cancelled mid-flight, with a step body that ends normally,
raises or is cancelled. The program runs in its own ``asyncio.run``; nothing in the test sleeps
to synchronise (only the targets sleep, to simulate server latency). Afterwards the start/stop
contract, the manifest and the event loop are checked.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

import aprof
from aprof.testing import RecordingTarget

MAX_STEP = 8
FINAL_STATES = {"done", "failed", "timeout", "skipped"}
LIVE_STATES = FINAL_STATES | {"running"}

Ending = Literal["normal", "raise", "cancel"]


class Boom(Exception):
    """What a step body raises when the program says so."""


class Recorder(RecordingTarget):
    """A RecordingTarget that also keeps the windows whose start succeeded, and every stop
    sent for a window whose start did not (aprof must send none)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.started_ok: list[aprof.Window] = []
        self.stops_not_started: list[aprof.Window] = []

    async def start(self, window: aprof.Window) -> None:
        await super().start(window)
        self.started_ok.append(window)

    async def stop(self, window: aprof.Window) -> aprof.CaptureResult:
        if window not in self.started_ok:
            self.stops_not_started.append(window)
        return await super().stop(window)


# -- programs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetPlan:
    """How one RecordingTarget misbehaves."""

    start_latency: float = 0.0
    stop_latency: float = 0.0
    fail_start: frozenset[int] = frozenset()
    fail_stop: frozenset[int] = frozenset()
    hang_start: frozenset[int] = frozenset()
    hang_stop: frozenset[int] = frozenset()
    enforces_window: bool = False

    def build(self, name: str, **kwargs: Any) -> Recorder:
        return Recorder(
            name,
            enforces_window=self.enforces_window,
            start_latency=self.start_latency,
            stop_latency=self.stop_latency,
            fail_start=self.fail_start,
            fail_stop=self.fail_stop,
            hang_start=self.hang_start,
            hang_stop=self.hang_stop,
            **kwargs,
        )


@dataclass(frozen=True)
class StepPlan:
    """One global step: how many requests race in it and how its body ends."""

    n: int
    requests: int
    seed: int
    """Seeds the per-request details (replica, forward steps, whom it cancels)."""
    cancel_rate: float
    ending: Ending


@dataclass(frozen=True)
class Program:
    """Everything one example runs."""

    steps_value: object
    """``global_profiler.steps`` as configured (list, range string or ``{every: k}``)."""
    selected: frozenset[int]
    """The steps among 1..MAX_STEP that ``steps_value`` selects."""
    rollout: tuple[TargetPlan, ...]
    role: TargetPlan | None
    steps: tuple[StepPlan, ...]
    replicas: list[int] | Literal["all"] = "all"
    start: Literal["on_first_request", "on_step"] = "on_first_request"
    delay: int = 0
    forward_steps: int | None = None
    continuous: bool = False
    wait_for_stops: bool = False
    start_s: float = 0.05
    stop_s: float = 0.1

    def config(self, save_path: Path) -> dict[str, Any]:
        return {
            "global_profiler": {
                "steps": self.steps_value,
                "save_path": str(save_path),
                "continuous": self.continuous,
                "wait_for_stops": self.wait_for_stops,
            },
            "rollout": {
                "replicas": self.replicas,
                "start": self.start,
                "delay": self.delay,
                "forward_steps": self.forward_steps,
            },
            "roles": {"actor": {}} if self.role is not None else {},
            "timeouts": {
                "connect_s": 0.05,
                "start_s": self.start_s,
                "stop_s": self.stop_s,
                "poll_s": 0.005,
            },
        }

    def replica_selected(self, replica: int) -> bool:
        return self.replicas == "all" or replica in self.replicas


@dataclass(frozen=True)
class RequestSpec:
    """One request coroutine: where it goes and what it does once admitted."""

    replica: int
    advances: int
    """Forward steps it runs on its replica's engine counter, one per event-loop turn."""
    cancels: tuple[int, ...]
    """Indices of sibling requests this one cancels once it is inside its request."""
    cancels_step: bool


def request_specs(plan: StepPlan, replicas: int) -> list[RequestSpec]:
    rng = random.Random(plan.seed)
    n = plan.requests
    trigger = rng.randrange(n) if plan.ending == "cancel" and n else None
    specs = []
    for i in range(n):
        cancels = tuple(rng.randrange(n) for _ in range(2) if rng.random() < plan.cancel_rate)
        specs.append(
            RequestSpec(
                # one index past the last target: a replica nobody serves
                replica=rng.randrange(replicas + 1),
                advances=rng.randint(0, 3),
                cancels=cancels,
                cancels_step=i == trigger,
            )
        )
    return specs


def _ranges(steps: list[int]) -> str:
    runs: list[list[int]] = []
    for n in sorted(steps):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@st.composite
def selections(draw: st.DrawFn) -> tuple[object, frozenset[int]]:
    form = draw(st.sampled_from(["list", "ranges", "every"]))
    if form == "every":
        k = draw(st.integers(1, 4))
        return {"every": k}, frozenset(n for n in range(1, MAX_STEP + 1) if n % k == 0)
    steps = draw(st.lists(st.integers(1, MAX_STEP), unique=True, max_size=MAX_STEP))
    value: object = _ranges(steps) if form == "ranges" and steps else steps
    return value, frozenset(steps)


def step_sets(max_faulty: int = 3) -> st.SearchStrategy[frozenset[int]]:
    some = st.frozensets(st.integers(1, MAX_STEP), min_size=1, max_size=max_faulty)
    return st.one_of(st.just(frozenset[int]()), st.just(frozenset[int]()), some)


latencies = st.sampled_from([0.0, 0.0, 0.001, 0.002, 0.003])

target_plans = st.builds(
    TargetPlan,
    start_latency=latencies,
    stop_latency=latencies,
    fail_start=step_sets(),
    fail_stop=step_sets(),
    hang_start=step_sets(2),
    hang_stop=step_sets(1),
    enforces_window=st.booleans(),
)


@st.composite
def programs(draw: st.DrawFn, max_requests: int = 300) -> Program:
    steps_value, selected = draw(selections())
    entered = draw(
        st.lists(st.integers(1, MAX_STEP), unique=True, min_size=1, max_size=MAX_STEP).map(sorted)
    )
    rollout = tuple(draw(st.lists(target_plans, min_size=1, max_size=4)))
    requests = st.one_of(st.integers(0, 12), st.integers(0, max_requests))
    plans = tuple(
        StepPlan(
            n=n,
            requests=draw(requests),
            seed=draw(st.integers(0, 2**32 - 1)),
            cancel_rate=draw(st.sampled_from([0.0, 0.05, 0.3])),
            ending=draw(st.sampled_from(["normal", "normal", "normal", "raise", "cancel"])),
        )
        for n in entered
    )
    forward_steps = draw(st.one_of(st.none(), st.integers(1, 4)))
    return Program(
        steps_value=steps_value,
        selected=selected,
        rollout=rollout,
        role=draw(st.one_of(st.none(), target_plans)),
        steps=plans,
        replicas=draw(st.one_of(st.just("all"), st.lists(st.integers(0, 4), unique=True))),
        start=draw(st.sampled_from(["on_first_request", "on_step"])),
        delay=draw(st.integers(0, 2)) if forward_steps is not None else 0,
        forward_steps=forward_steps,
        continuous=draw(st.booleans()),
        wait_for_stops=draw(st.booleans()),
        start_s=draw(st.sampled_from([0.05, 0.1])),
        stop_s=draw(st.sampled_from([0.05, 0.1])),
    )


# -- running a program ----------------------------------------------------------------------


@dataclass
class Trace:
    """What the driver saw while running a program."""

    handles: list[tuple[int, aprof.Request]] = field(default_factory=list)
    """(step the request was sent in, its handle), for every request that was entered."""
    sent: Counter[tuple[int, int]] = field(default_factory=Counter)
    """Requests entered per (step, replica)."""
    outcomes: dict[int, str] = field(default_factory=dict)
    """How each step's context ended: ``ok``, ``error`` or ``cancelled``."""


async def one_request(
    prof: aprof.Profiler,
    step: int,
    spec: RequestSpec,
    target: RecordingTarget | None,
    siblings: list[asyncio.Task[None]],
    owner: asyncio.Task[Any],
    trace: Trace,
) -> None:
    req = prof.request(replica=spec.replica, request_id=f"s{step}")
    trace.handles.append((step, req))
    trace.sent[(step, spec.replica)] += 1
    async with req:
        await asyncio.sleep(0)
        for i in spec.cancels:
            siblings[i].cancel()
        if spec.cancels_step:
            owner.cancel()
        for _ in range(spec.advances):
            if target is not None:
                target.advance(1)
            await asyncio.sleep(0)


async def run_step(
    prof: aprof.Profiler,
    plan: StepPlan,
    targets: dict[int, Recorder],
    trace: Trace,
) -> None:
    owner = asyncio.current_task()
    assert owner is not None
    specs = request_specs(plan, len(targets))
    async with prof.step(plan.n), asyncio.TaskGroup() as tg:
        tasks: list[asyncio.Task[None]] = []
        for spec in specs:
            coro = one_request(prof, plan.n, spec, targets.get(spec.replica), tasks, owner, trace)
            tasks.append(tg.create_task(coro))
        if plan.ending == "raise":
            if tasks:
                await asyncio.wait(tasks[: len(tasks) // 2 + 1])
            raise Boom(plan.n)
        if plan.ending == "cancel" and not tasks:
            owner.cancel()
            await asyncio.sleep(0)


def check_disk(save: Path, program: Program) -> aprof.Manifest:
    """The manifest on disk parses and holds only windows of selected steps, once each."""
    manifest = aprof.load_manifest(save)
    keys = [(w.step, w.target) for w in manifest.windows]
    assert len(keys) == len(set(keys)), f"a (step, target) listed twice: {keys}"
    for w in manifest.windows:
        assert w.step in program.selected, f"window of unselected step: {w}"
        assert w.state in LIVE_STATES
    return manifest


async def run_program(program: Program, save: Path) -> None:
    prof = aprof.Profiler(program.config(save))
    targets = {r: plan.build(f"replica_{r}", replica=r) for r, plan in enumerate(program.rollout)}
    role = program.role.build("actor", kind="role") if program.role is not None else None
    for t in targets.values():
        prof.add_target(t)
    if role is not None:
        prof.add_target(role)
    trace = Trace()
    before = asyncio.all_tasks()
    async with prof:
        for plan in program.steps:
            task = asyncio.create_task(run_step(prof, plan, targets, trace))
            await asyncio.wait({task})
            trace.outcomes[plan.n] = outcome = _outcome(task)
            if outcome == "cancelled":
                assert plan.ending == "cancel", f"step {plan.n} cancelled by the profiler"
            if outcome == "error":
                assert plan.ending == "raise", f"step {plan.n} raised {task.exception()!r}"
            await prof.flush()
            check_disk(save, program)
    left = {t for t in asyncio.all_tasks() - before if not t.done()}
    assert not left, f"tasks left pending after aclose(): {sorted(t.get_name() for t in left)}"
    all_targets = [*targets.values(), *([role] if role is not None else [])]
    check_after_close(program, prof, save, all_targets, trace)


def _outcome(task: asyncio.Task[None]) -> str:
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    if exc is None:
        return "ok"
    boom = isinstance(exc, Boom) or (
        isinstance(exc, BaseExceptionGroup) and exc.subgroup(Boom) is not None
    )
    assert boom, f"the step body raised something it did not raise: {exc!r}"
    return "error"


def check_after_close(
    program: Program,
    prof: aprof.Profiler,
    save: Path,
    targets: list[Recorder],
    trace: Trace,
) -> None:
    manifest = check_disk(save, program)
    assert manifest.model_dump() == prof.manifest.model_dump(), "disk and memory differ"
    records = {(w.step, w.target): w for w in manifest.windows}

    for (step, target), w in records.items():
        if currently_in_test_context():  # coverage statistics: --hypothesis-show-statistics
            event(f"window {w.kind} {w.state} {w.stop_reason}")
        assert w.state in FINAL_STATES, f"{target} step {step} left {w.state!r}"
        if w.state == "done":
            assert w.started_ns is not None and w.stopped_ns is not None
            assert w.started_ns <= w.stopped_ns
            for f in w.files:
                assert (save / f.path).is_file(), f"listed file missing: {f.path}"
        if w.kind == "rollout":
            replica = int(target.removeprefix("replica_"))
            assert w.requests.gated <= w.requests.admitted <= trace.sent[(step, replica)]

    for t in targets:
        starts: Counter[int] = Counter()
        stops: Counter[int] = Counter()
        started = []
        for call in t.calls:
            if call.window is None:
                continue
            assert call.window.step in program.selected, f"{t.name} called for {call.window}"
            assert call.window.target == t.name
            if call.op == "start":
                starts[call.window.step] += 1
                started.append(call.window)
            elif call.op == "stop":
                stops[call.window.step] += 1
                assert call.window in started, f"{t.name}: stop without a start: {call.window}"
        assert not t.stops_not_started, f"{t.name}: stop of a failed start {t.stops_not_started}"
        assert all(c <= 1 for c in starts.values()), f"{t.name} started twice: {starts}"
        assert all(c <= 1 for c in stops.values()), f"{t.name} stopped twice: {stops}"
        for (step, name), w in records.items():
            if name == t.name and w.state == "done":
                assert stops[step] == 1, f"{name} step {step} is done without a stop"
        assert set(starts) <= {s for s, n in records if n == t.name}

    entered = [p.n for p in program.steps if p.n in program.selected]
    for t in targets:
        have = sorted(s for s, n in records if n == t.name)
        if t.kind == "rollout":
            assert t.replica is not None
            want = entered if program.replica_selected(t.replica) else []
        else:  # continuous role windows carry over from a step that ended normally
            want = [
                n
                for n in entered
                if not (program.continuous and n - 1 in entered and trace.outcomes[n - 1] == "ok")
            ]
        assert have == want, f"{t.name}: windows for steps {have}, expected {want}"

    started_ok = {(w.step, t.replica) for t in targets for w in t.started_ok}
    for step, req in trace.handles:
        assert req.step == step, f"{req!r} sent in step {step}"
        if req.captured:  # it went ahead while its replica's capture of this step ran
            assert (step, req.replica) in started_ok, f"{req!r} captured by no capture"


def run(program: Program) -> None:
    with tempfile.TemporaryDirectory(prefix="aprof-prop-") as tmp:
        asyncio.run(run_program(program, Path(tmp) / "profile"))


# -- tests ------------------------------------------------------------------------------------


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs())
def test_generated_programs_keep_the_window_contract(program: Program) -> None:
    """Any mix of selections, faults, racing/cancelled requests and step endings keeps the
    contract: each (step, target) started and stopped at most once, stops only after starts,
    windows only for selected steps, every window final after aclose(), the manifest always
    parsable, no profiler task left pending, and request handles tagged with their step."""
    run(program)


def test_thousands_of_racing_requests() -> None:
    """A few thousand requests per step racing over four faulty replicas and a role target,
    with cancellations and a cancelled step, keep the same contract."""
    slow = TargetPlan(start_latency=0.003, stop_latency=0.002)
    program = Program(
        steps_value="1-3,5",
        selected=frozenset({1, 2, 3, 5}),
        rollout=(
            slow,
            TargetPlan(start_latency=0.001, fail_stop=frozenset({2})),
            TargetPlan(hang_start=frozenset({3}), enforces_window=True),
            TargetPlan(fail_start=frozenset({1}), stop_latency=0.003),
        ),
        role=slow,
        steps=(
            StepPlan(n=1, requests=3000, seed=1, cancel_rate=0.05, ending="normal"),
            StepPlan(n=2, requests=2500, seed=2, cancel_rate=0.0, ending="raise"),
            StepPlan(n=3, requests=3000, seed=3, cancel_rate=0.05, ending="cancel"),
            StepPlan(n=4, requests=500, seed=4, cancel_rate=0.0, ending="normal"),
            StepPlan(n=5, requests=3000, seed=5, cancel_rate=0.3, ending="normal"),
        ),
        forward_steps=64,
        continuous=True,
    )
    run(program)
