"""On-demand capture asked from another Ray process: ``RemoteProfiler.capture`` goes through the
hub to the driver, which decides it as its own ``prof.capture``; the answer comes back. Targets
added and removed there (``add_target``, ``remove_target``) go the same way.

The Ray tests run a driver profiler (async or blocking) shared with a Ray async actor on a
real local cluster; the hub's rules for capture requests are also checked without Ray.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import aprof
import aprof.ray
from aprof._control import CaptureAnswer
from aprof._core.sharing import RolloutView
from aprof.ray._hub import Call, Decision, Hub
from aprof.testing import RecordingTarget

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aprof[ray]')")

LIMIT_S = 120
"""Every test with a cluster is bounded by this; each Ray call of the blocking one too."""
MakeConfig = Callable[..., aprof.ProfilerConfig]
on_cluster = pytest.mark.usefixtures("ray_cluster")


class Asker:
    """A process that asks the driver's shared profiler for captures."""

    def __init__(self, handle: aprof.ray.ShareHandle) -> None:
        self.remote = aprof.ray.connect(handle, role="controller")

    async def capture(self, **kwargs: Any) -> CaptureAnswer:
        return await self.remote.capture(**kwargs)

    async def failure(self, **kwargs: Any) -> aprof.AprofError:
        """The error ``capture(**kwargs)`` raises here, in this process."""
        try:
            answer = await self.remote.capture(**kwargs)
        except aprof.AprofError as exc:
            return exc
        raise AssertionError(f"capture({kwargs}) answered {answer!r}")

    async def close(self) -> None:
        await self.remote.aclose()


RemoteAsker = ray.remote(Asker)


class Fleet:
    """A process that runs servers for the driver: it adds and removes their targets."""

    def __init__(self, handle: aprof.ray.ShareHandle) -> None:
        self.remote = aprof.ray.connect(handle, role="fleet")

    async def add(self, name: str, replica: int) -> None:
        await self.remote.add_target(RecordingTarget(name, replica=replica))

    async def remove(self, name: str) -> None:
        await self.remote.remove_target(name)

    async def failure(self, op: str, *args: Any) -> aprof.AprofError:
        """The error ``add`` or ``remove`` raises here, in this process."""
        try:
            await getattr(self, op)(*args)
        except aprof.AprofError as exc:
            return exc
        raise AssertionError(f"{op}{args} went through")

    async def close(self) -> None:
        await self.remote.aclose()


RemoteFleet = ray.remote(Fleet)


def _config(make_config: MakeConfig) -> aprof.ProfilerConfig:
    """No step selected; windows start with their step, and each step ends once its windows
    have stopped."""
    return make_config(
        global_profiler={"steps": [], "wait_for_stops": True},
        rollout={"start": "on_step", "forward_steps": None},
        timeouts={"connect_s": 30},  # a bound: actors just started may take a while to answer
    )


def _windows(prof: aprof.Profiler | aprof.BlockingProfiler) -> list[tuple[int, str, str, str]]:
    return [(w.step, w.target, w.requested_by, w.state) for w in prof.manifest.windows]


def _starts(target: RecordingTarget) -> list[int]:
    """The steps whose windows ``target`` was started for."""
    return [c.window.step for c in target.calls if c.op == "start" and c.window is not None]


def _answers(save_path: Path) -> dict[str, dict[str, Any]]:
    """The answers the driver wrote, by request id."""
    folder = save_path / "control" / "answers"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return {p.stem: json.loads(p.read_text()) for p in files}


def _check_accepted(answer: CaptureAnswer, run_id: str) -> None:
    """The driver's answer to ``next=2`` asked after step 1."""
    assert isinstance(answer, CaptureAnswer)
    assert answer.accepted, answer.reason
    assert answer.steps == [2, 3]  # the next two steps not begun
    assert answer.targets == ["replica_0"]
    assert answer.requested_by == "on_demand"
    assert (answer.decided_at, answer.run_id) == (2, run_id)  # decided by the driver


@on_cluster
async def test_a_remote_capture_is_decided_by_the_driver_and_captures_exactly_its_steps(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(_config(make_config)) as prof:
        prof.add_target(target)
        asker = RemoteAsker.remote(aprof.ray.share(prof))
        async with prof.step(1):
            pass
        answer = await asker.capture.remote(next=2)
        _check_accepted(answer, prof.run_id)
        for n in (2, 3, 4):
            async with prof.step(n):
                pass
        await asker.close.remote()
    assert _windows(prof) == [
        (2, "replica_0", "on_demand", "done"),
        (3, "replica_0", "on_demand", "done"),
    ]
    assert _starts(target) == [2, 3]
    written = _answers(prof.save_path)
    assert written[answer.id] == answer.model_dump(mode="json", by_alias=True)


@on_cluster
async def test_a_remote_process_adds_and_removes_the_drivers_targets(
    make_config: MakeConfig,
) -> None:
    """Targets come and go through a shared profiler as through the driver's own: one added
    there takes part from the next step, one removed during its window ends it (``removed``),
    and what the driver refuses (a name taken, a name unknown) is a ``TargetError`` there."""
    cfg = make_config(
        global_profiler={"steps": [1, 2]},
        rollout={"replicas": "all", "start": "on_step", "forward_steps": None},
        timeouts={"connect_s": 30},
    )
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(cfg) as prof:
        prof.add_target(RecordingTarget("replica_0", replica=0))
        fleet = RemoteFleet.remote(aprof.ray.share(prof))
        await fleet.add.remote("replica_1", 1)
        async with prof.step(1):
            await fleet.remove.remote("replica_0")  # during its window
        taken = await fleet.failure.remote("add", "replica_1", 1)
        unknown = await fleet.failure.remote("remove", "replica_9")
        async with prof.step(2):
            pass
        await fleet.close.remote()
    assert [(w.step, w.target, w.state, w.stop_reason) for w in prof.manifest.windows] == [
        (1, "replica_0", "done", "removed"),
        (1, "replica_1", "done", "step_end"),
        (2, "replica_1", "done", "step_end"),
    ]
    assert isinstance(taken, aprof.TargetError)
    assert str(taken) == "a target named 'replica_1' is already registered"
    assert isinstance(unknown, aprof.TargetError)
    assert str(unknown).startswith("no target named 'replica_9' is registered")


@on_cluster
def test_a_blocking_driver_decides_a_remote_capture(make_config: MakeConfig) -> None:
    target = RecordingTarget("replica_0", replica=0)
    with aprof.BlockingProfiler(_config(make_config)) as prof:
        prof.add_target(target)
        asker = RemoteAsker.remote(aprof.ray.share(prof))
        with prof.step(1):
            pass
        # The driver's thread waits here; its profiler decides in its own event loop.
        answer = ray.get(asker.capture.remote(next=2), timeout=LIMIT_S)
        _check_accepted(answer, prof._profiler.run_id)
        for n in (2, 3, 4):
            with prof.step(n):
                pass
        ray.get(asker.close.remote(), timeout=LIMIT_S)
    assert _windows(prof) == [
        (2, "replica_0", "on_demand", "done"),
        (3, "replica_0", "on_demand", "done"),
    ]
    assert _starts(target) == [2, 3]


@on_cluster
async def test_a_remote_capture_of_a_step_begun_is_refused_with_its_reason(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(_config(make_config)) as prof:
        prof.add_target(target)
        asker = RemoteAsker.remote(aprof.ray.share(prof))
        async with prof.step(1):
            begun = await asker.capture.remote(steps=[1, 2])
            unknown = await asker.capture.remote(next=1, replicas=[7])
        async with prof.step(2):
            pass
        await asker.close.remote()
    assert not begun.accepted and begun.steps == []
    assert begun.reason == "step(s) 1 began already; the first step not begun is 2"
    assert not unknown.accepted
    assert unknown.reason == "no target serves replica(s) 7 (replicas with a target: 0)"
    assert _windows(prof) == []  # all or nothing: step 2 was not added either
    assert target.calls == []
    assert {a["accepted"] for a in _answers(prof.save_path).values()} == {False}


@on_cluster
async def test_a_malformed_remote_capture_raises_config_error_in_its_process(
    make_config: MakeConfig,
) -> None:
    target = RecordingTarget("replica_0", replica=0)
    async with asyncio.timeout(LIMIT_S), aprof.Profiler(_config(make_config)) as prof:
        prof.add_target(target)
        handle = aprof.ray.share(prof)
        asker = RemoteAsker.remote(handle)
        zero = await asker.failure.remote(next=0)
        both = await asker.failure.remote(next=1, steps=[3])
        twice = await asker.failure.remote(replicas=[0, 0])
        # Checked there first, never sent: the driver decided nothing.
        await prof.flush()
        assert _answers(prof.save_path) == {}
        # The driver checks too (a request straight to the hub): its error comes back.
        decision = await handle.hub.call.remote(Call("capture", {"next": 0}))
        async with prof.step(1):
            pass
        await asker.close.remote()
    assert isinstance(zero, aprof.ConfigError)
    assert (zero.key, zero.reason) == ("next", "must be >= 1, got 0")
    assert isinstance(both, aprof.ConfigError)
    assert str(both) == "give one of next and steps, not both"
    assert isinstance(twice, aprof.ConfigError) and twice.key == "replicas[1]"
    assert decision == Decision(malformed=("next", "must be >= 1, got 0"))
    assert _windows(prof) == [] and target.calls == []


@on_cluster
async def test_a_remote_capture_after_the_driver_closed_raises_usage_error(
    make_config: MakeConfig,
) -> None:
    async with asyncio.timeout(LIMIT_S):
        async with aprof.Profiler(_config(make_config)) as prof:
            prof.add_target(RecordingTarget("replica_0", replica=0))
            asker = RemoteAsker.remote(aprof.ray.share(prof))
            assert (await asker.capture.remote(next=1)).accepted
        # The driver's close closed the asker's remote profiler and ended the hub.
        late = await asker.failure.remote(next=1)
    assert isinstance(late, aprof.UsageError)
    assert "capture request" in str(late) and "next 1 step(s)" in str(late)


async def test_a_remote_profiler_that_never_reached_the_hub_says_so(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    class Unreachable:
        """A hub handle whose every call fails, as a hub that is gone."""

        def __getattr__(self, name: str) -> Any:
            raise ConnectionError(f"no hub for {name}")

    cfg = make_config()
    handle = aprof.ray.ShareHandle(
        Unreachable(), cfg.model_dump(mode="json"), str(tmp_path / "profile"), "run"
    )
    remote = aprof.ray.connect(handle)
    with pytest.raises(aprof.ConfigError, match="forward_steps"):  # malformed first
        await remote.capture(forward_steps=0)
    with pytest.raises(aprof.UsageError, match=r"cannot be reached.*no hub for register"):
        await remote.capture(next=1)
    await remote.aclose()
    with pytest.raises(aprof.UsageError, match="remote profiler is closed"):
        await remote.capture(next=1)


# -- the hub's rules for capture requests, without Ray ---------------------------------------


def _hub() -> Hub:
    return Hub(start_s=5.0, connect_s=0.05)


async def test_the_hub_hands_a_capture_to_the_driver_and_its_decision_back() -> None:
    hub = _hub()
    asking = asyncio.create_task(hub.call(Call("capture", {"next": 2})))
    [mail] = await asyncio.wait_for(hub.pull(5.0, 0), 5)  # returns as the request comes
    assert list(mail.calls.values()) == [("capture", {"next": 2})]
    (number,) = mail.calls
    answer = {"accepted": True, "steps": [4, 5]}
    await hub.decided({number: Decision(answer=answer), number + 1: Decision(error="gone")})
    assert await asyncio.wait_for(asking, 5) == Decision(answer=answer)
    assert await hub.pull(0, mail.number) == []


async def test_a_capture_the_driver_never_took_is_withdrawn() -> None:
    hub = _hub()
    decision = await asyncio.wait_for(hub.call(Call("capture", {"next": 1})), 5)  # connect_s
    assert decision.answer is None and decision.error is not None
    assert "withdrawn, not carried out" in decision.error
    assert await hub.pull(0, 0) == []  # the driver will not decide it later


async def test_a_capture_the_driver_took_and_did_not_answer_may_still_be_decided() -> None:
    hub = _hub()
    asking = asyncio.create_task(hub.call(Call("capture", {"next": 1})))
    [mail] = await asyncio.wait_for(hub.pull(5.0, 0), 5)
    decision = await asyncio.wait_for(asking, 5)  # waits connect_s at most
    assert decision.error is not None and "may still be carried out" in decision.error
    await hub.decided({n: Decision(answer={}) for n in mail.calls})  # too late: dropped


async def test_a_closing_driver_takes_no_capture() -> None:
    hub = _hub()
    await hub.publish(RolloutView(1, None, False, {}, closing=True))
    decision = await asyncio.wait_for(hub.call(Call("capture", {"next": 1})), 5)
    assert decision == Decision(error="the driver's profiler is closing")
    assert await hub.pull(0, 0) == []
