"""Targets added and removed while a run goes on (``prof.add_target``, ``prof.remove_target``):
a target removed during its window ends it (stop sent once, ``stop_reason: removed``), one
added during a step takes part from the next step, and a replica index reused by a new server
is a new target with windows of its own."""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aprof
from aprof.testing import RecordingTarget

STEPS = 5


def config(save: Path, **rollout: Any) -> dict[str, Any]:
    return {
        "global_profiler": {"steps": f"1-{STEPS}", "save_path": str(save)},
        "rollout": {"replicas": "all", **rollout},
        "roles": {"actor": {}},
        "timeouts": {"connect_s": 0.5, "start_s": 1.0, "stop_s": 1.0, "poll_s": 0.005},
        "log": {"level": "warning"},
    }


def windows_of(prof: aprof.Profiler, target: str) -> dict[int, aprof.WindowRecord]:
    return {w.step: w for w in prof.manifest.windows if w.target == target}


async def test_a_replica_removed_mid_window_ends_it_with_one_stop(tmp_path: Path) -> None:
    old = RecordingTarget("replica_0", replica=0)
    other = RecordingTarget("replica_1", replica=1)
    async with aprof.Profiler(config(tmp_path)) as prof:
        prof.add_target(old)
        prof.add_target(other)
        async with prof.step(1):
            async with prof.request(replica=0, request_id="a"):
                pass
            async with prof.request(replica=1, request_id="b"):
                pass
            prof.remove_target("replica_0")
            async with prof.request(replica=0, request_id="c"):  # nobody serves it now
                pass
            # The same replica served by a new server: a new target, from the next step.
            new = RecordingTarget("replica_0", replica=0)
            prof.add_target(new)
            async with prof.request(replica=0, request_id="d"):
                pass
        async with prof.step(2), prof.request(replica=0, request_id="e"):
            pass
    assert [w.step for w in old.starts] == [1] and [w.step for w in old.stops] == [1]
    assert [w.step for w in new.starts] == [2] and [w.step for w in new.stops] == [2]
    records = windows_of(prof, "replica_0")
    assert sorted(records) == [1, 2]
    first = records[1]
    assert (first.state, first.stop_reason) == ("done", "removed")
    assert first.requests.admitted == 1  # only "a": the later ones found no window of it
    assert (records[2].state, records[2].stop_reason) == ("done", "step_end")
    assert windows_of(prof, "replica_1")[1].stop_reason == "step_end"


async def test_a_replica_removed_before_its_first_request_is_skipped_as_removed(
    tmp_path: Path,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with aprof.Profiler(config(tmp_path)) as prof:
        prof.add_target(target)
        async with prof.step(1):
            prof.remove_target("replica_0")
    (record,) = prof.manifest.windows
    assert (record.state, record.stop_reason) == ("skipped", "removed")
    notes = [(n.step, n.target, n.text) for n in prof.manifest.notes]
    assert (1, "replica_0", "target removed before a request reached replica 0") in notes
    assert target.calls == []


@pytest.mark.parametrize("continuous", [False, True])
async def test_a_role_removed_inside_a_step_ends_its_window(
    tmp_path: Path, continuous: bool
) -> None:
    cfg = config(tmp_path)
    cfg["global_profiler"]["continuous"] = continuous
    actor = RecordingTarget("actor", kind="role")
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(actor)
        async with prof.step(1):
            pass
        async with prof.step(2):
            prof.remove_target("actor")
        async with prof.step(3):
            pass
    starts, stops = [w.step for w in actor.starts], [w.step for w in actor.stops]
    assert len(stops) == len(starts) == (1 if continuous else 2)
    last = windows_of(prof, "actor")[starts[-1]]
    assert last.stop_reason == "removed" and last.state == "done"
    assert 3 not in windows_of(prof, "actor")


async def test_removing_a_target_that_is_not_there_is_one_clear_error(tmp_path: Path) -> None:
    prof = aprof.Profiler(config(tmp_path))
    prof.add_target(RecordingTarget("replica_0", replica=0))
    with pytest.raises(aprof.TargetError, match=r"no target named 'replica_9'.*'replica_0'"):
        prof.remove_target("replica_9")
    prof.remove_target("replica_0")  # before the run: nothing to stop
    async with prof:
        pass
    with pytest.raises(aprof.UsageError, match="closed"):
        prof.remove_target("replica_0")


def test_the_blocking_profiler_removes_targets_too(tmp_path: Path) -> None:
    target = RecordingTarget("actor", kind="role")
    with aprof.BlockingProfiler(config(tmp_path)) as prof:
        prof.add_target(target)
        with prof.step(1):
            prof.remove_target("actor")
        with prof.step(2):
            pass
    assert [w.step for w in target.stops] == [1]
    assert windows_of(prof._profiler, "actor")[1].stop_reason == "removed"


# -- any interleaving -----------------------------------------------------------------------

Op = tuple[Literal["request", "add", "remove"], int]
"""A request to replica k, adding a new server for replica k, removing replica k's target."""


@dataclass(frozen=True)
class Program:
    start: Literal["on_first_request", "on_step"]
    continuous: bool
    latency: float
    before: tuple[tuple[Op, ...], ...]
    """Per step, what happens between the steps before it."""
    inside: tuple[tuple[Op, ...], ...]
    """Per step, what happens inside it."""


ops = st.tuples(st.sampled_from(["request", "request", "add", "remove"]), st.integers(0, 3))
programs = st.builds(
    Program,
    start=st.sampled_from(["on_first_request", "on_step"]),
    continuous=st.booleans(),
    latency=st.sampled_from([0.0, 0.001]),
    before=st.lists(st.lists(ops, max_size=3).map(tuple), min_size=STEPS, max_size=STEPS).map(
        tuple
    ),
    inside=st.lists(st.lists(ops, max_size=8).map(tuple), min_size=STEPS, max_size=STEPS).map(
        tuple
    ),
)


class Server(RecordingTarget):
    """One server's target: a rollout replica (k < 3) or the ``actor`` role (k == 3)."""

    def __init__(self, k: int, latency: float, added_in: int) -> None:
        if k == 3:
            super().__init__("actor", kind="role", start_latency=latency, stop_latency=latency)
        else:
            super().__init__(f"replica_{k}", replica=k, start_latency=latency, stop_latency=latency)
        self.added_in = added_in
        """The first step it may capture: it was added before that step began."""
        self.removed_in: int | None = None
        """The last step it may capture: the step it was removed in, or before."""
        self.removed_inside = False
        """Removed inside step ``removed_in``: its window of that step, if any, ends so."""


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=programs)
def test_any_interleaving_of_adds_removes_requests_and_steps_is_exactly_once(
    program: Program,
) -> None:
    """Each (step, target) window starts at most once and, once started, is stopped exactly
    once; a server never captures a step that began before it was added, nor one after it was
    removed; the manifest lists each (step, target name) once, ``removed`` for each window
    its target was removed in."""
    with tempfile.TemporaryDirectory() as tmp:
        servers = asyncio.run(_run(program, Path(tmp)))
        manifest = aprof.load_manifest(tmp)
    keys = [(w.step, w.target) for w in manifest.windows]
    assert len(keys) == len(set(keys)), keys
    records = {(w.step, w.target): w for w in manifest.windows}
    for server in servers:
        starts = Counter(w.step for w in server.starts)
        stops = Counter(w.step for w in server.stops)
        assert all(c == 1 for c in starts.values()), starts
        assert stops == starts, (server.name, starts, stops)  # each started one stopped once
        last = STEPS if server.removed_in is None else server.removed_in
        assert all(server.added_in <= n <= last for n in starts), (server.added_in, starts)
        for n in starts:
            record = records[(n, server.name)]
            assert record.state == "done"
            if server.removed_inside and server.removed_in == n:
                assert record.stop_reason == "removed"


async def _run(program: Program, save: Path) -> list[Server]:
    cfg = config(save, start=program.start)
    cfg["global_profiler"]["continuous"] = program.continuous
    registered: dict[int, Server] = {}
    every: list[Server] = []

    def apply(op: Op, step: int, inside: bool) -> list[asyncio.Task[None]]:
        kind, k = op
        if kind == "add" and k not in registered:
            registered[k] = server = Server(k, program.latency, step + 1 if inside else step)
            every.append(server)
            prof.add_target(server)
        elif kind == "remove" and k in registered:
            server = registered.pop(k)
            server.removed_in = step  # between steps: the step before (its window may run on)
            server.removed_inside = inside
            prof.remove_target(server.name)
        elif kind == "request" and k < 3 and inside:
            return [asyncio.create_task(_request(prof, k))]
        return []

    async with aprof.Profiler(cfg) as prof:
        for n in range(1, STEPS + 1):
            for op in program.before[n - 1]:
                apply(op, n - 1 if op[0] == "remove" else n, inside=False)
            async with prof.step(n):
                pending: list[asyncio.Task[None]] = []
                for op in program.inside[n - 1]:
                    pending += apply(op, n, inside=True)
                    await asyncio.sleep(0)
                if pending:
                    await asyncio.wait(pending)
    return every


async def _request(prof: aprof.Profiler, replica: int) -> None:
    async with prof.request(replica=replica, request_id=f"r{replica}"):
        await asyncio.sleep(0)
