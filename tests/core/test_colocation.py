"""Captures on shared devices (``colocated``): a role's capture and its replicas' never run at
once when they exclude each other, the waits are in the manifest, a rollout stop that hangs
skips the role capture instead of hanging the step, and torch captures sharing devices do not
wait. The targets record, on one shared device, which captures run on it at each start."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aprof
from aprof import CaptureResult, Window
from aprof.testing import RecordingTarget


class Device:
    """The role's accelerators, which each replica shares (replicas have devices of their own):
    the captures running on them, and every start that found one of the other side running."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.overlaps: list[tuple[str, list[str]]] = []
        self.starts: list[str] = []


class OnDevice(RecordingTarget):
    """A target whose captures run on ``device``: from its start's success to its stop's end."""

    def __init__(self, name: str, device: Device, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.device = device

    async def start(self, window: Window) -> None:
        await super().start(window)
        others = sorted(n for n in self.device.running if (n == "actor") != (self.name == "actor"))
        if others:
            self.device.overlaps.append((self.name, others))
        self.device.running.add(self.name)
        self.device.starts.append(self.name)

    async def stop(self, window: Window) -> CaptureResult:
        try:
            return await super().stop(window)
        finally:
            self.device.running.discard(self.name)


def config(save: Path, *, tool: str = "npu", discrete: bool = False, **extra: Any) -> dict:
    rollout = {"replicas": "all", "forward_steps": 2, **extra.pop("rollout", {})}
    return {
        "global_profiler": {"steps": [1, 2], "save_path": str(save), "tool": tool}
        | extra.pop("global_profiler", {}),
        "rollout": rollout,
        "roles": {"actor": {"discrete": discrete}},
        "colocated": [{"role": "actor", "replicas": "all"}],
        "timeouts": {"connect_s": 0.5, "start_s": 2.0, "stop_s": 2.0, "poll_s": 0.005}
        | extra.pop("timeouts", {}),
        "log": {"level": "warning"},
        **extra,
    }


def targets(device: Device, **replica: Any) -> tuple[OnDevice, list[OnDevice]]:
    actor = OnDevice("actor", device, kind="role")
    replicas = [OnDevice(f"replica_{r}", device, replica=r, **replica) for r in (0, 1)]
    return actor, replicas


@contextlib.asynccontextmanager
async def profiled(
    cfg: dict[str, Any], **replica: Any
) -> AsyncIterator[tuple[aprof.Profiler, Device, OnDevice, list[OnDevice]]]:
    """An open profiler with the actor and two replicas (made with ``replica``) on one device:
    the profiler, the device and the targets."""
    device = Device()
    actor, replicas = targets(device, **replica)
    async with aprof.Profiler(cfg) as prof:
        for target in (actor, *replicas):
            prof.add_target(target)
        yield prof, device, actor, replicas


def window(prof: aprof.Profiler, step: int, target: str) -> aprof.WindowRecord:
    (found,) = [w for w in prof.manifest.windows if (w.step, w.target) == (step, target)]
    return found


@pytest.mark.parametrize("start", ["on_first_request", "on_step"])
@pytest.mark.parametrize("discrete", [False, True])
async def test_the_role_capture_starts_once_the_steps_rollout_has_stopped(
    tmp_path: Path, start: str, discrete: bool
) -> None:
    cfg = config(tmp_path, discrete=discrete, rollout={"start": start})
    async with profiled(cfg) as (prof, device, actor, replicas), prof.step(1):
        assert actor.starts == []  # held: the step's rollout on its devices goes first
        for r, target in enumerate(replicas):
            async with prof.request(replica=r):
                target.advance(2)  # its window ends by itself after 2 forward steps
        for target in replicas:
            await target.wait_calls("stop")
        await actor.wait_calls("start")
    assert device.overlaps == []
    assert device.starts == ["replica_0", "replica_1", "actor"] or (
        start == "on_step" and sorted(device.starts[:2]) == ["replica_0", "replica_1"]
    )
    held = window(prof, 1, "actor")
    assert held.state == "done" and held.waited_for is not None
    assert held.waited_for.targets == ["replica_0", "replica_1"]
    assert held.waited_for.seconds >= 0
    assert all(window(prof, 1, f"replica_{r}").stop_reason == "auto_stop" for r in (0, 1))


async def test_roles_started_returns_once_the_held_role_capture_runs(tmp_path: Path) -> None:
    """After ``rollout_ended()``, ``roles_started()`` waits for the rollout's stop (slow here)
    and the held role capture's start: what the caller runs next is captured."""
    cfg = config(tmp_path, rollout={"forward_steps": None})
    async with profiled(cfg, stop_latency=0.05) as (prof, device, actor, _replicas):
        async with prof.step(1):
            await prof.roles_started()  # nothing held yet waits: the rollout goes on
            async with prof.request(replica=0):
                pass
            prof.rollout_ended()
            await prof.roles_started()
            assert actor.active is not None and device.running == {"actor"}
        await prof.roles_started()  # outside a step: at once
    assert device.overlaps == []


async def test_rollout_ended_ends_the_rollout_and_lets_the_role_start(tmp_path: Path) -> None:
    cfg = config(tmp_path, rollout={"forward_steps": None})
    async with profiled(cfg) as (prof, device, actor, _replicas):
        async with prof.step(1):
            async with prof.request(replica=0):
                pass
            prof.rollout_ended()  # replica 1 saw no request: skipped, never opened later
            await actor.wait_calls("start")
            async with prof.request(replica=1) as req:
                assert not req.captured and not req.gated
        prof.rollout_ended()  # outside a step: nothing to end
    assert device.overlaps == []
    assert device.starts == ["replica_0", "actor"]
    first = window(prof, 1, "replica_0")
    assert (first.state, first.stop_reason) == ("done", "rollout_end")
    unreached = window(prof, 1, "replica_1")
    assert (unreached.state, unreached.stop_reason) == ("skipped", "rollout_end")
    assert window(prof, 1, "actor").waited_for is not None
    on_disk = aprof.load_manifest(tmp_path)
    assert window(prof, 1, "actor") in on_disk.windows


async def test_a_rollout_window_opening_on_a_running_role_capture_is_skipped(
    tmp_path: Path,
) -> None:
    """A continuous role window holds its devices across its steps: step 2's rollout on them
    is skipped at once, its requests ungated."""
    cfg = config(tmp_path, global_profiler={"continuous": True})
    async with profiled(cfg) as (prof, device, actor, replicas):
        async with prof.step(1):
            prof.rollout_ended()
            await actor.wait_calls("start")
        async with prof.step(2):
            async with prof.request(replica=0) as req:
                assert not req.gated and not req.captured
            async with prof.request(replica=0):
                pass
    assert device.overlaps == []
    assert [w.step for w in replicas[0].starts] == []
    skipped = window(prof, 2, "replica_0")
    assert (skipped.state, skipped.stop_reason) == ("skipped", "colocated")
    notes = [n.text for n in prof.manifest.notes if (n.step, n.target) == (2, "replica_0")]
    assert notes == ["the capture of actor (colocated) runs on replica 0's devices"]
    assert window(prof, 1, "actor").state == "done"


async def test_a_rollout_stop_that_hangs_skips_the_role_capture_not_the_step(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, timeouts={"stop_s": 0.2, "start_s": 0.2})
    async with profiled(cfg, hang_stop=True) as (prof, device, actor, replicas), prof.step(1):
        async with prof.request(replica=0):
            pass
        prof.rollout_ended()
        await replicas[0].wait_calls("stop")
    assert actor.starts == [] and device.overlaps == []
    hung = window(prof, 1, "replica_0")
    assert hung.state == "timeout"
    role = window(prof, 1, "actor")
    assert (role.state, role.stop_reason) == ("skipped", "colocated")
    assert role.waited_for is not None and role.waited_for.targets == ["replica_0", "replica_1"]
    notes = [n.text for n in prof.manifest.notes if n.target == "actor"]
    assert len(notes) == 1 and notes[0].startswith("replica_0 (step 1) did not stop cleanly")


async def test_a_capture_of_an_earlier_step_still_stopping_is_waited_for(tmp_path: Path) -> None:
    """Step 1's rollout capture is still stopping (its stop hangs) when step 2 begins: step 2's
    role capture, whose step captures no replica, waits for that stop, which times out, so the
    role capture is skipped: it never starts beside a capture that may still run."""
    cfg = config(tmp_path, global_profiler={"steps": []}, timeouts={"stop_s": 0.2})
    async with profiled(cfg, hang_stop=True) as (prof, device, actor, _replicas):
        prof.capture(steps=[1], replicas=[0])
        async with prof.step(1), prof.request(replica=0):
            pass
        prof.capture(steps=[2], roles=["actor"])
        async with prof.step(2):
            pass
    assert device.overlaps == [] and actor.starts == []
    role = window(prof, 2, "actor")
    assert (role.state, role.stop_reason) == ("skipped", "colocated")
    assert role.waited_for is not None and role.waited_for.targets == ["replica_0"]
    assert window(prof, 1, "replica_0").state == "timeout"


async def test_the_step_ending_before_its_rollout_skips_the_held_role_capture(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, rollout={"forward_steps": None})
    async with (
        profiled(cfg) as (prof, device, actor, _replicas),
        prof.step(1),
        prof.request(replica=0),
    ):
        pass
    assert actor.starts == [] and device.overlaps == []
    role = window(prof, 1, "actor")
    assert (role.state, role.stop_reason) == ("skipped", "step_end")
    (note,) = [n.text for n in prof.manifest.notes if n.target == "actor"]
    assert note.startswith("the step ended before its rollout on replica(s) 0, 1 did")


async def test_a_capture_whose_target_was_removed_is_waited_for_while_it_stops(
    tmp_path: Path,
) -> None:
    """Replica 0's target is removed mid-capture and its stop hangs: the role capture still
    waits for it (its capture may still run on the devices), and is skipped when it does not
    stop."""
    cfg = config(tmp_path, timeouts={"stop_s": 0.2})
    async with profiled(cfg, hang_stop=True) as (prof, device, actor, replicas), prof.step(1):
        async with prof.request(replica=0):
            pass
        prof.remove_target("replica_0")
        prof.rollout_ended()
        await replicas[0].wait_calls("stop")  # its stop hangs; the step goes on
    assert device.overlaps == [] and actor.starts == []
    role = window(prof, 1, "actor")
    assert (role.state, role.stop_reason) == ("skipped", "colocated")
    assert role.waited_for is not None and "replica_0" in role.waited_for.targets


async def test_a_held_role_target_removed_is_skipped_as_removed(tmp_path: Path) -> None:
    async with profiled(config(tmp_path)) as (prof, device, actor, _replicas), prof.step(1):
        async with prof.request(replica=0):
            pass
        prof.remove_target("actor")
        prof.rollout_ended()
    assert actor.calls == [] and device.overlaps == []
    role = window(prof, 1, "actor")
    assert (role.state, role.stop_reason) == ("skipped", "removed")


@pytest.mark.parametrize(("tool", "exclusive"), [("torch", None), ("npu", False)])
async def test_captures_allowed_to_share_devices_do_not_wait(
    tmp_path: Path, tool: str, exclusive: bool | None
) -> None:
    cfg = config(tmp_path, tool=tool)
    cfg["colocated"][0]["exclusive"] = exclusive
    async with profiled(cfg) as (prof, device, actor, _replicas), prof.step(1):
        assert [w.step for w in actor.starts] == [1]  # the step waited for it, as always
        async with prof.request(replica=0) as req:
            assert req.captured
    assert device.overlaps == [("replica_0", ["actor"])]
    assert window(prof, 1, "actor").waited_for is None


# --- any interleaving ---------------------------------------------------------------------

OPS = st.lists(
    st.sampled_from(["request0", "request1", "advance0", "advance1", "rollout_ended", "yield"]),
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(OPS, min_size=1, max_size=3),
    start=st.sampled_from(["on_first_request", "on_step"]),
    discrete=st.booleans(),
    continuous=st.booleans(),
    forward=st.sampled_from([1, 3, None]),
)
def test_no_two_exclusive_captures_ever_share_the_device(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[list[str]],
    start: str,
    discrete: bool,
    continuous: bool,
    forward: int | None,
) -> None:
    """Requests, forward steps, rollout ends and step boundaries in any order: the device
    never runs two captures at once, every window ends, and a role window that ran waited."""
    save = tmp_path_factory.mktemp("colocated")

    async def run() -> aprof.Profiler:
        cfg = config(
            save,
            discrete=discrete,
            rollout={"start": start, "forward_steps": forward},
            global_profiler={"steps": list(range(1, len(steps) + 1)), "continuous": continuous},
        )
        async with profiled(cfg) as (prof, device, _actor, replicas):
            for n, ops in enumerate(steps, start=1):
                async with prof.step(n):
                    for op in ops:
                        if op.startswith("request"):
                            async with prof.request(replica=int(op[-1])):
                                pass
                        elif op.startswith("advance"):
                            replicas[int(op[-1])].advance()
                        elif op == "rollout_ended":
                            prof.rollout_ended()
                        else:
                            await asyncio.sleep(0)
        assert device.overlaps == []
        return prof

    prof = asyncio.run(run())
    assert all(w.state != "running" for w in prof.manifest.windows)
    for w in prof.manifest.windows:
        if w.kind == "role" and w.started_ns is not None and w.step == 1 and w.waited_for:
            assert set(w.waited_for.targets) <= {"replica_0", "replica_1"}
