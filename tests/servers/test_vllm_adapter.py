"""``servers.VLLMServer`` over real HTTP against the reference server, era by era.

Window semantics are driven through ``aprof.Profiler``; protocol details call the adapter
directly. Every wait is bounded; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from adapter_steps import STEPS, TIMEOUTS, answered, config, run_steps, window
from conftest import Complete, ReferenceFactory, on_another_device

import aprof
from aprof.testing import assert_windows
from servers import ProfilingDisabledError, ServerError, SessionConflictError, VLLMServer
from servers.reference import forward_step_numbers
from servers.versions import parse_version


def worker_steps(save: Path, step: int) -> list[int]:
    """Forward steps recorded by the worker traces of ``step``'s window of replica 0."""
    folder = save / f"step_{step}" / "rollout" / "replica_0"
    traces = [p for p in folder.glob("*.pt.trace.json.gz") if "async_llm" not in p.name]
    assert traces, f"no worker trace in {folder}"
    return sorted(k for trace in traces for k in forward_step_numbers(trace))


def traces_left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def test_032_windows_are_bounded_per_call_by_the_server(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    save = tmp_path / "profile"
    async with asyncio.timeout(120), reference_server(vllm_version="0.32.0") as server:
        prof = aprof.Profiler(config(save))
        prof.add_target(VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir))
        await run_steps(prof, server, complete)
    done = {"state": "done", "stop_reason": "auto_stop", "error": None}
    counts = {
        "forward_steps.observed": 4,
        "forward_steps.enforced_by": "server",
        "forward_steps.counted_from": "trace",
    }
    assert_windows(prof.manifest, [{"step": n, **done, **counts} for n in STEPS])
    for n in STEPS:
        steps = worker_steps(save, n)
        assert len(steps) == 4 and steps == list(range(steps[0], steps[0] + 4))
        record = prof.manifest.window(n, "replica_0")
        assert record is not None
        # Worker trace, its summary and the front-end trace, all named by the window's prefix.
        assert len(record.files) == 3
        assert all(
            f.path.startswith(f"step_{n}/rollout/replica_0/replica_0-step{n}-")
            for f in record.files
        )
    assert server.profiler_dir is not None and traces_left(server.profiler_dir) == []
    # Steps 1 and 2 follow each other: the stop after the auto-stop let step 2 start (no 409).
    assert len(answered(logs, "/stop_profile")) == 3


async def test_032_delay_is_skipped_by_the_server(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(60), reference_server(vllm_version="0.32.0") as server:
        target = VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir)
        await target.open(timeouts)
        try:
            await complete(server, max_tokens=3)
            before = server.forward_steps
            win = window(tmp_path / "w", delay=3, forward_steps=4)
            await target.start(win)
            await complete(server, max_tokens=12)
            result = await target.stop(win)
        finally:
            await target.aclose()
    (trace,) = [
        p
        for p in result.files
        if p.name.endswith(".pt.trace.json.gz") and "async_llm" not in p.name
    ]
    assert forward_step_numbers(trace) == [before + 4, before + 5, before + 6, before + 7]
    assert (result.forward_steps, result.auto_stopped) == (4, True)


@pytest.mark.parametrize("version", ["0.11.0", "0.12.0", "0.14.0", "0.20.0", "0.31.0"])
async def test_windows_before_032_are_bounded_by_polling(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, version: str
) -> None:
    save = tmp_path / "profile"
    async with asyncio.timeout(120), reference_server(vllm_version=version) as server:
        target = VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir)
        prof = aprof.Profiler(config(save))
        prof.add_target(target)
        await run_steps(prof, server, complete)
    assert target.enforces_window is False
    assert_windows(
        prof.manifest,
        [{"step": n, "state": "done", "forward_steps.enforced_by": "aprof"} for n in STEPS],
    )
    for n in STEPS:
        record = prof.manifest.window(n, "replica_0")
        assert record is not None and (record.forward_steps.observed or 0) >= 4
        assert len(worker_steps(save, n)) >= 4
    # Matched by modification time and moved: nothing is left where the server wrote.
    assert server.profiler_dir is not None and traces_left(server.profiler_dir) == []


@pytest.mark.parametrize(("version", "delay"), [("0.12.0", 0), ("0.14.0", 2), ("0.20.0", 0)])
async def test_launch_time_window_is_bounded_by_the_server(
    reference_server: ReferenceFactory,
    complete: Complete,
    tmp_path: Path,
    version: str,
    delay: int,
) -> None:
    save = tmp_path / "profile"
    launch = (delay + 1 if delay else 0, 4)  # vLLM's delay_iterations D skips D - 1 steps
    async with (
        asyncio.timeout(120),
        reference_server(
            vllm_version=version, launch_delay_iterations=launch[0], launch_max_iterations=4
        ) as server,
    ):
        target = VLLMServer(
            server.url, replica=0, profiler_dir=server.profiler_dir, launch_window=launch
        )
        prof = aprof.Profiler(config(save, delay=delay))
        prof.add_target(target)
        await run_steps(prof, server, complete)
    expected = {"state": "done", "stop_reason": "auto_stop", "forward_steps.observed": 4}
    assert_windows(
        prof.manifest,
        [{"step": n, "forward_steps.enforced_by": "server", **expected} for n in STEPS],
    )
    for n in STEPS:
        assert len(worker_steps(save, n)) == 4


async def test_launch_window_that_differs_from_the_window_fails_it(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path
) -> None:
    save = tmp_path / "profile"
    async with (
        asyncio.timeout(60),
        reference_server(vllm_version="0.20.0", launch_max_iterations=4) as server,
    ):
        target = VLLMServer(server.url, replica=0, launch_window=(0, 4))
        prof = aprof.Profiler(config(save, forward_steps=8))
        prof.add_target(target)
        await run_steps(prof, server, complete)
    assert_windows(prof.manifest, [{"step": n, "state": "failed"} for n in STEPS])
    record = prof.manifest.window(1, "replica_0")
    assert record is not None and record.error is not None
    assert "delay_iterations=0, max_iterations=8" in record.error


@pytest.mark.parametrize(
    ("version", "enforces"), [("0.14.1", False), ("0.32.0", True), ("0.34.0", True)]
)
async def test_version_is_read_from_the_server_when_not_given(
    reference_server: ReferenceFactory, version: str, enforces: bool, logs: list[Any]
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(30), reference_server(vllm_version=version) as server:
        found = VLLMServer(server.url, replica=0)
        given = VLLMServer(server.url, replica=1, version=version)
        for target in (found, given):
            await target.open(timeouts)
            await target.aclose()
    assert found.version == given.version == parse_version(version)
    assert found.enforces_window is given.enforces_window is enforces
    assert [e["replica"] for e in answered(logs, "/version")] == [0]


@pytest.mark.parametrize(
    ("version", "flag"),
    [
        ("0.11.0", "VLLM_TORCH_PROFILER_DIR=/srv/traces"),
        ("0.12.0", "VLLM_TORCH_PROFILER_DIR=/srv/traces"),
        (
            "0.13.0",
            "--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=/srv/traces",
        ),
        (
            "0.32.0",
            "--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=/srv/traces",
        ),
        (  # 0.34 changed no part of the profiling protocol (docs/servers.md)
            "0.34.0",
            "--profiler-config.profiler=torch --profiler-config.torch_profiler_dir=/srv/traces",
        ),
    ],
)
async def test_404_fails_the_window_and_names_the_launch_flag(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, version: str, flag: str
) -> None:
    async with (
        asyncio.timeout(60),
        reference_server(vllm_version=version, profiling=False, profiler_dir=None) as server,
    ):
        prof = aprof.Profiler(config(tmp_path / "profile"))
        prof.add_target(VLLMServer(server.url, replica=0, profiler_dir="/srv/traces"))
        await run_steps(prof, server, complete)
    assert_windows(prof.manifest, [{"step": n, "state": "failed"} for n in STEPS])
    error = prof.manifest.windows[0].error
    assert error is not None
    assert "ProfilingDisabledError: profiling was not enabled at the launch" in error
    assert flag in error


async def test_409_means_a_foreign_session_that_aprof_leaves_alone(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path, logs: list[Any]
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(60), reference_server(vllm_version="0.32.0") as server:
        owner = VLLMServer(server.url, replica=1)
        await owner.open(timeouts)
        foreign = window(tmp_path / "foreign")
        await owner.start(foreign)
        prof = aprof.Profiler(config(tmp_path / "profile"))
        prof.add_target(VLLMServer(server.url, replica=0))
        await run_steps(prof, server, complete)
        # The foreign session is still running: only its owner stops it.
        assert [e["replica"] for e in answered(logs, "/stop_profile")] == []
        await owner.stop(foreign)
        await owner.aclose()
    assert_windows(prof.manifest, [{"step": n, "state": "failed"} for n in STEPS])
    error = prof.manifest.windows[0].error
    assert error is not None and "SessionConflictError" in error
    assert "a profiling session aprof did not start is active" in error


async def test_409_error_type_on_a_direct_start(
    reference_server: ReferenceFactory, tmp_path: Path
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(60), reference_server(vllm_version="0.32.0") as server:
        first, second = VLLMServer(server.url, replica=0), VLLMServer(server.url, replica=1)
        for target in (first, second):
            await target.open(timeouts)
        await first.start(window(tmp_path / "a"))
        with pytest.raises(SessionConflictError):
            await second.start(window(tmp_path / "b"))
        await first.stop(window(tmp_path / "a"))
        for target in (first, second):
            await target.aclose()


@pytest.mark.parametrize("version", ["0.11.0", "0.29.0"])
async def test_never_stops_a_session_it_did_not_start(
    reference_server: ReferenceFactory, tmp_path: Path, version: str, logs: list[Any]
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(30), reference_server(vllm_version=version) as server:
        target = VLLMServer(server.url, replica=0)
        await target.open(timeouts)
        with pytest.raises(RuntimeError, match="did not start"):
            await target.stop(window(tmp_path / "w"))
        await target.aclose()
    assert answered(logs, "/stop_profile") == []


async def test_404_error_type_on_a_direct_start(
    reference_server: ReferenceFactory, tmp_path: Path
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with (
        asyncio.timeout(30),
        reference_server(vllm_version="0.20.0", profiling=False, profiler_dir=None) as server,
    ):
        target = VLLMServer(server.url, replica=0)
        await target.open(timeouts)
        with pytest.raises(
            ProfilingDisabledError, match=re.escape("--profiler-config.profiler=torch")
        ):
            await target.start(window(tmp_path / "w"))
        await target.aclose()


async def test_without_profiler_dir_traces_stay_where_the_server_wrote_them(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path
) -> None:
    async with asyncio.timeout(120), reference_server(vllm_version="0.32.0") as server:
        prof = aprof.Profiler(config(tmp_path / "profile"))
        prof.add_target(VLLMServer(server.url, replica=0))
        await run_steps(prof, server, complete)
    assert_windows(
        prof.manifest,
        [
            {"step": n, "state": "done", "files": [], "forward_steps.counted_from": "counter"}
            for n in STEPS
        ],
    )
    assert all("traces stay where vLLM wrote them" in note.text for note in prof.manifest.notes)
    assert server.profiler_dir is not None
    assert len([n for n in traces_left(server.profiler_dir) if n.endswith(".gz")]) == 6


async def test_unreachable_profiler_dir_is_noted(
    reference_server: ReferenceFactory, complete: Complete, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "on-another-machine"
    async with asyncio.timeout(120), reference_server(vllm_version="0.32.0") as server:
        prof = aprof.Profiler(config(tmp_path / "profile"))
        prof.add_target(VLLMServer(server.url, replica=0, profiler_dir=elsewhere))
        await run_steps(prof, server, complete)
    assert_windows(prof.manifest, [{"step": n, "state": "done", "files": []} for n in STEPS])
    assert all(f"{elsewhere} is not reachable" in note.text for note in prof.manifest.notes)


async def test_traces_are_copied_across_devices(
    reference_server: ReferenceFactory,
    complete: Complete,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save = tmp_path / "profile"
    async with asyncio.timeout(120), reference_server(vllm_version="0.31.0") as server:
        assert server.profiler_dir is not None
        on_another_device(monkeypatch, server.profiler_dir)
        prof = aprof.Profiler(config(save))
        prof.add_target(VLLMServer(server.url, replica=0, profiler_dir=server.profiler_dir))
        await run_steps(prof, server, complete)
    assert_windows(prof.manifest, [{"step": n, "state": "done"} for n in STEPS])
    for n in STEPS:
        assert len(worker_steps(save, n)) >= 4
    assert server.profiler_dir is not None and traces_left(server.profiler_dir) == []


async def test_forward_steps_reads_the_metrics_counter(
    reference_server: ReferenceFactory, complete: Complete
) -> None:
    timeouts = aprof.TimeoutsConfig(**TIMEOUTS)
    async with asyncio.timeout(60):
        async with reference_server(vllm_version="0.32.0") as server:
            target = VLLMServer(server.url, replica=0)
            await target.open(timeouts)
            await complete(server, max_tokens=5)
            assert await target.forward_steps() == server.forward_steps == 5
            await target.aclose()
        # An SGLang server has no vLLM step counter.
        async with reference_server(dialect="sglang") as other:
            target = VLLMServer(other.url, replica=0, version="0.32.0")
            await target.open(timeouts)
            assert await target.forward_steps() is None
            await target.aclose()


def test_bad_arguments_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="not a version: 'latest'"):
        VLLMServer("http://127.0.0.1:1", replica=0, version="latest")
    with pytest.raises(ValueError, match="launch_window"):
        VLLMServer("http://127.0.0.1:1", replica=0, launch_window=(0, -1))


async def test_launch_window_needs_0_12(reference_server: ReferenceFactory, tmp_path: Path) -> None:
    async with asyncio.timeout(30), reference_server(vllm_version="0.11.0") as server:
        target = VLLMServer(server.url, replica=0, launch_window=(0, 4))
        with pytest.raises(ValueError, match="cannot bound captures at launch"):
            await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        await target.aclose()


async def test_failed_open_closes_its_session(reference_server: ReferenceFactory) -> None:
    """The profiler never closes a target whose open failed: the adapter closes its session."""
    async with asyncio.timeout(30), reference_server(dialect="sglang") as server:
        target = VLLMServer(server.url, replica=0)  # an SGLang server has no /version
        with pytest.raises(ServerError, match="404"):
            await target.open(aprof.TimeoutsConfig(**TIMEOUTS))
        with pytest.raises(RuntimeError, match=r"call open\(\) before"):
            await target.forward_steps()


def test_is_a_managed_capture_target() -> None:
    target = VLLMServer("http://127.0.0.1:1/", replica=3)
    assert isinstance(target, aprof.CaptureTarget) and isinstance(target, aprof.ManagedTarget)
    assert (target.name, target.kind, target.replica) == ("replica_3", "rollout", 3)
