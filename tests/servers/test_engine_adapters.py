"""The in-process SGLang adapter (``servers.engines.SGLangEngine``) against a DOUBLE.

SGLang cannot run on this CPU-only machine (no CPU wheels on PyPI, see the reference note),
so these tests drive a double of its ``TokenizerManager`` and scheduler profiler that mirrors
the real signatures and call order: 0.5.23's ``start_profile(req: ProfileReq | None = None)``
(which fills ``req_type``, ``with_stack``, ``record_shapes`` and ``profile_id`` before handing
the request to the scheduler and raising ``RuntimeError(message)`` on failure) and the keyword
form of 0.4.10 that verl calls; the scheduler counts forward batches in ``run_batch`` the way
SGLang does (stop check, then start check, then the forward), including the one-batch-short
plain ``num_steps`` of releases before 0.5.20. The vLLM adapter runs against real vLLM in
``e2e/``.
"""

from __future__ import annotations

import enum
import gzip
import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import aprof
from aprof.testing import assert_windows
from servers.engines import SGLangEngine

NOT_IN_PROGRESS = "Profiling is not in progress. Call /start_profile first."
ALREADY = "Profiling is already in progress. Call /stop_profile first."


class ProfileReqType(enum.Enum):
    START_PROFILE = 1
    STOP_PROFILE = 2


class ProfileReq:
    """0.5.23's ``ProfileReq`` (a msgspec ``Struct``, keyword-only, every field defaulted)."""

    rid: str | None = None
    http_worker_ipc: str | None = None
    req_type: ProfileReqType | None = None
    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: list[str] | None = None
    profile_by_stage: bool = False
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    merge_profiles: bool = False
    profile_prefix: str | None = None
    profile_stages: list[str] | None = None
    detailed_annotations: bool = False
    __struct_fields__ = (
        "rid",
        "http_worker_ipc",
        "req_type",
        "output_dir",
        "start_step",
        "num_steps",
        "activities",
        "profile_by_stage",
        "with_stack",
        "record_shapes",
        "profile_id",
        "merge_profiles",
        "profile_prefix",
        "profile_stages",
        "detailed_annotations",
    )

    def __init__(self, **fields: Any) -> None:
        unknown = set(fields) - set(self.__struct_fields__)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {sorted(unknown)[0]!r}")
        for name, value in fields.items():
            setattr(self, name, value)


class ProfileReqOutput:
    def __init__(self, success: bool, message: str) -> None:
        self.success = success
        self.message = message


class SchedulerDouble:
    """The scheduler's profiler: ``forward_ct``, start/stop targets, one trace per capture."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.version = version
        self.forward_ct = 0
        self.in_progress = False
        self.start_ct: int | None = None
        self.target_ct: int | None = None
        self.req: ProfileReq | None = None
        self.recorded: list[int] = []
        self.written: list[Path] = []

    def profile(self, req: ProfileReq) -> ProfileReqOutput:
        if req.req_type is ProfileReqType.START_PROFILE:
            return self._init(req)
        return self._stop()

    def run_batch(self) -> None:
        """One forward batch: stop check, start check, then the forward."""
        self.forward_ct += 1
        if self.target_ct is not None and self.forward_ct >= self.target_ct:
            self._stop()
        if self.start_ct is not None and self.forward_ct == self.start_ct:
            self.in_progress = True
        if self.in_progress:
            self.recorded.append(self.forward_ct)

    def _init(self, req: ProfileReq) -> ProfileReqOutput:
        if self.in_progress or self.start_ct is not None:
            return ProfileReqOutput(False, ALREADY)
        self.req, self.recorded = req, []
        self.target_ct = None
        if req.start_step:
            self.start_ct = max(req.start_step, self.forward_ct + 1)
        if req.num_steps:
            if self.start_ct is not None:
                self.target_ct = self.start_ct + req.num_steps
            elif self.version >= (0, 5, 20):
                self.target_ct = self.forward_ct + req.num_steps + 1
            else:
                self.target_ct = self.forward_ct + req.num_steps  # one batch short
        if self.start_ct is None:
            self.in_progress = True
        return ProfileReqOutput(True, "Succeeded")

    def _stop(self) -> ProfileReqOutput:
        if not self.in_progress:
            return ProfileReqOutput(False, NOT_IN_PROGRESS)
        assert self.req is not None and self.req.output_dir is not None
        prefix = f"{self.req.profile_prefix}-" if self.req.profile_prefix else ""
        path = Path(self.req.output_dir) / f"{prefix}{self.req.profile_id}-TP-0.trace.json.gz"
        events = [
            {"ph": "X", "cat": "user_annotation", "name": f"forward_batch#{n}"}
            for n in self.recorded
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
        self.written.append(path)
        self.in_progress, self.start_ct, self.target_ct = False, None, None
        return ProfileReqOutput(True, "Succeeded.")


class TokenizerManagerDouble:
    """0.5.23: ``start_profile(req=None)`` and ``stop_profile()``, both coroutines."""

    def __init__(self, scheduler: SchedulerDouble) -> None:
        self.scheduler = scheduler
        self.calls: list[str] = []

    def auto_create_handle_loop(self) -> None:
        self.calls.append("auto_create_handle_loop")

    async def start_profile(self, req: ProfileReq | None = None) -> ProfileReqOutput:
        self.auto_create_handle_loop()
        self.calls.append("start_profile")
        req = req or ProfileReq()
        req.req_type = ProfileReqType.START_PROFILE
        req.with_stack = req.with_stack is not False  # SGLANG_PROFILE_WITH_STACK unset: true
        req.record_shapes = req.record_shapes is not False
        req.profile_id = req.profile_id or str(time.time())
        return await self._execute_profile(req)

    async def stop_profile(self) -> ProfileReqOutput:
        self.auto_create_handle_loop()
        self.calls.append("stop_profile")
        return await self._execute_profile(ProfileReq(req_type=ProfileReqType.STOP_PROFILE))

    async def _execute_profile(self, req: ProfileReq) -> ProfileReqOutput:
        result = self.scheduler.profile(req)  # the real one asks every scheduler, reads [0]
        if not result.success:
            raise RuntimeError(result.message)
        return result


class KeywordTokenizerManagerDouble(TokenizerManagerDouble):
    """0.4.10: keyword arguments (verl's call); no ``profile_id`` or prefix parameter."""

    async def start_profile(  # type: ignore[override]
        self,
        output_dir: str | None = None,
        start_step: int | None = None,
        num_steps: int | None = None,
        activities: list[str] | None = None,
        with_stack: bool | None = None,
        record_shapes: bool | None = None,
        profile_by_stage: bool = False,
    ) -> ProfileReqOutput:
        self.auto_create_handle_loop()
        self.calls.append("start_profile")
        req = ProfileReq(
            req_type=ProfileReqType.START_PROFILE,
            output_dir=output_dir,
            start_step=start_step,
            num_steps=num_steps,
            activities=activities,
            with_stack=with_stack is not False,
            record_shapes=record_shapes,
            profile_by_stage=profile_by_stage,
            profile_id=str(time.time()),
        )
        return await self._execute_profile(req)


@pytest.fixture(autouse=True)
def io_struct(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``sglang.srt.managers.io_struct`` with the double's ``ProfileReq``."""
    names = ["sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.managers.io_struct"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(sys.modules[names[-1]], "ProfileReq", ProfileReq, raising=False)
    yield


def _config(tmp_path: Path, steps: list[int], **rollout: Any) -> aprof.ProfilerConfig:
    return aprof.load_config(
        {
            "global_profiler": {
                "steps": steps,
                "save_path": str(tmp_path / "profile"),
                "wait_for_stops": True,  # the double's batches never yield to the event loop
            },
            "rollout": {"forward_steps": 3, **rollout},
            "timeouts": {"start_s": 5, "stop_s": 5},
            "log": {"level": "warning"},
        }
    )


async def _run(
    cfg: aprof.ProfilerConfig, target: SGLangEngine, scheduler: SchedulerDouble, batches: int
) -> aprof.Profiler:
    """Steps 1 to 3: one request per step that runs ``batches`` forward batches."""
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        for step in range(1, 4):
            async with prof.step(step), prof.request(replica=0):
                for _ in range(batches):
                    scheduler.run_batch()
    return prof


def _batches(path: Path) -> int:
    return len(json.loads(gzip.decompress(path.read_bytes()))["traceEvents"])


async def test_double_request_form_bounds_each_window_on_the_engine(tmp_path: Path) -> None:
    """0.5.23: one ``ProfileReq`` per window, exact ``num_steps``, no stop after the auto-stop."""
    scheduler = SchedulerDouble((0, 5, 23))
    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23")
    prof = await _run(_config(tmp_path, [1, 3]), target, scheduler, batches=6)
    window = {"state": "done", "stop_reason": "auto_stop", "forward_steps.enforced_by": "server"}
    assert_windows(prof.manifest, [{**window, "step": 1}, {**window, "step": 3}])
    # A stop after each auto-stop all the same: its "not in progress" reads as already stopped.
    assert manager.calls == [
        "auto_create_handle_loop", "start_profile", "auto_create_handle_loop", "stop_profile"
    ] * 2  # fmt: skip
    assert scheduler.req is not None
    assert scheduler.req.output_dir == str(tmp_path / "profile/step_3/rollout/replica_0")
    assert (scheduler.req.num_steps, scheduler.req.start_step) == (3, None)
    assert scheduler.req.activities == ["CPU", "GPU"]
    assert (scheduler.req.with_stack, scheduler.req.record_shapes) == (False, False)
    assert scheduler.req.profile_by_stage is False
    for record, written in zip(prof.manifest.windows, scheduler.written, strict=True):
        assert [f.path for f in record.files] == [
            f"step_{record.step}/rollout/replica_0/{written.name}"
        ]
        run_id = prof.manifest.run_id
        assert written.name == f"replica_0-step{record.step}-{run_id}-TP-0.trace.json.gz"
        assert _batches(written) == 3


async def test_double_stop_is_sent_when_the_window_ends_first(tmp_path: Path) -> None:
    scheduler = SchedulerDouble((0, 5, 23))
    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23")
    prof = await _run(_config(tmp_path, [1]), target, scheduler, batches=2)
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "step_end"}])
    assert manager.calls[-1] == "stop_profile"
    assert _batches(scheduler.written[0]) == 2


async def test_double_keyword_form_before_0_5_20_asks_one_batch_more(tmp_path: Path) -> None:
    """0.4.10 records plain ``num_steps`` minus one: the adapter asks for one more."""
    scheduler = SchedulerDouble((0, 4, 10))
    manager = KeywordTokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.4.10", contents=["cpu", "stack"])
    prof = await _run(_config(tmp_path, [1]), target, scheduler, batches=6)
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "auto_stop"}])
    assert scheduler.req is not None
    assert (scheduler.req.num_steps, scheduler.req.activities) == (4, ["CPU"])
    assert scheduler.req.with_stack is True
    assert _batches(scheduler.written[0]) == 3


async def test_double_delay_becomes_a_fresh_absolute_start_step(tmp_path: Path) -> None:
    """With a forward counter the delay skips batches counted from now, whatever ran before."""
    scheduler = SchedulerDouble((0, 5, 23))
    for _ in range(40):  # traffic since launch: a stale start_step would be in the past
        scheduler.run_batch()

    async def counter() -> int:
        return scheduler.forward_ct

    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23", forward_counter=counter)
    prof = await _run(_config(tmp_path, [1], delay=2), target, scheduler, batches=8)
    window = {"step": 1, "state": "done", "stop_reason": "auto_stop"}
    assert_windows(prof.manifest, [{**window, "forward_steps.observed": 3}])
    assert scheduler.req is not None and scheduler.req.start_step == 43
    assert _batches(scheduler.written[0]) == 3
    assert manager.calls.count("start_profile") == manager.calls.count("stop_profile") == 1


async def test_double_delay_without_counter_is_reported(tmp_path: Path) -> None:
    scheduler = SchedulerDouble((0, 5, 23))
    target = SGLangEngine(TokenizerManagerDouble(scheduler), replica=0, version="0.5.23")
    prof = await _run(_config(tmp_path, [1], delay=2), target, scheduler, batches=6)
    assert scheduler.req is not None and scheduler.req.start_step is None
    assert any("delay of 2 not applied" in note.text for note in prof.manifest.notes)


async def test_double_refused_stop_after_a_vanished_auto_stop_is_read_as_done(
    tmp_path: Path,
) -> None:
    """The engine ended the capture but its trace is not in the folder (yet): the stop's
    "not in progress" means "already stopped" for a capture told to end itself."""
    scheduler = SchedulerDouble((0, 5, 23))
    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23")
    cfg = _config(tmp_path, [1])
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1), prof.request(replica=0):
            for _ in range(5):
                scheduler.run_batch()
            scheduler.written[0].unlink()
    assert_windows(prof.manifest, [{"step": 1, "state": "done", "stop_reason": "auto_stop"}])
    assert manager.calls[-1] == "stop_profile"


async def test_double_refusals_fail_the_window_with_the_engine_message(tmp_path: Path) -> None:
    """A capture someone else scheduled (start_step) makes the engine refuse our start."""
    scheduler = SchedulerDouble((0, 5, 23))
    scheduler.profile(ProfileReq(req_type=ProfileReqType.START_PROFILE, start_step=99, num_steps=1))
    target = SGLangEngine(TokenizerManagerDouble(scheduler), replica=0, version="0.5.23")
    prof = await _run(_config(tmp_path, [1]), target, scheduler, batches=2)
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    assert ALREADY in (prof.manifest.windows[0].error or "")


async def test_double_unbounded_window_stopped_with_nothing_running_fails(
    tmp_path: Path,
) -> None:
    """Without num_steps a "not in progress" stop is an error, not an auto-stop."""
    scheduler = SchedulerDouble((0, 5, 23))
    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23")
    cfg = _config(tmp_path, [1], forward_steps=None)
    async with aprof.Profiler(cfg) as prof:
        prof.add_target(target)
        async with prof.step(1), prof.request(replica=0):
            scheduler.run_batch()
            scheduler.in_progress = False  # lost behind the adapter's back
    assert_windows(prof.manifest, [{"step": 1, "state": "failed"}])
    assert NOT_IN_PROGRESS in (prof.manifest.windows[0].error or "")


def test_double_version_comes_from_the_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules["sglang"], "__version__", "0.5.10", raising=False)
    SGLangEngine(TokenizerManagerDouble(SchedulerDouble((0, 5, 10))), replica=1)
    monkeypatch.delattr(sys.modules["sglang"], "__version__")
    with pytest.raises(ValueError, match="pass version="):
        SGLangEngine(TokenizerManagerDouble(SchedulerDouble((0, 5, 10))), replica=1)


async def test_double_failing_forward_counter_costs_only_the_count(tmp_path: Path) -> None:
    """A ``forward_counter`` that raises once the engine has started the capture must not
    fail the start and leave the target holding a window that no stop ever ends."""
    scheduler = SchedulerDouble((0, 5, 23))

    async def counter() -> int:
        raise ConnectionError("metrics endpoint down")

    manager = TokenizerManagerDouble(scheduler)
    target = SGLangEngine(manager, replica=0, version="0.5.23", forward_counter=counter)
    prof = await _run(_config(tmp_path, [1, 2]), target, scheduler, batches=6)
    window = {"state": "done", "stop_reason": "auto_stop", "forward_steps.observed": None}
    assert_windows(prof.manifest, [{**window, "step": 1}, {**window, "step": 2}])
    assert manager.calls.count("start_profile") == 2
