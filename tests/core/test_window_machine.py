"""A window's life: the table of moves is the only way a window's phase changes, what the
manifest and other processes see is derived from the phase, and no other module writes it."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aprof
from aprof._core.window_machine import MOVES, Phase, WindowRun, manifest_state, shared_phase
from aprof._manifest import ForwardSteps, WindowRecord

ROOT = Path(__file__).resolve().parents[2]
WRITTEN_ONLY_BY_THE_WINDOW = {"phase", "_phase", "state", "stop_reason", "started_ns", "stopped_ns"}


def new_run(told: list[tuple[Phase, str | None]] | None = None) -> WindowRun:
    window = aprof.Window(
        step=3,
        target="replica_0",
        kind="rollout",
        delay=0,
        forward_steps=8,
        dir=Path("w"),
        prefix="p",
    )
    record = WindowRecord(
        step=3,
        target="replica_0",
        kind="rollout",
        tool="torch",
        forward_steps=ForwardSteps(requested=8),
    )

    def on_change(run: WindowRun, phase: Phase, detail: str | None) -> None:
        assert run.phase is phase  # told after the move
        if told is not None:
            told.append((phase, detail))

    return WindowRun(window, record, on_change)


def move(run: WindowRun, to: Phase) -> None:
    """``run`` moved to ``to`` by the method that names that move."""
    if to is Phase.STARTING:
        run.begin_start()
    elif to is Phase.ACTIVE:
        run.activate("aprof")
    elif to is Phase.STOPPING:
        run.begin_stop()
    else:
        run.end(to, None if to is Phase.DONE else f"ended {to.value}")


def test_the_table_reaches_every_phase_and_ends_in_the_final_ones() -> None:
    reached, frontier = {Phase.QUEUED}, [Phase.QUEUED]
    while frontier:
        nxt = [to for phase in frontier for to in MOVES[phase] if to not in reached]
        reached |= set(nxt)
        frontier = nxt
    assert reached == set(Phase)
    assert {p for p in Phase if p.final} == {Phase.DONE, Phase.FAILED, Phase.TIMEOUT, Phase.SKIPPED}


@given(st.lists(st.sampled_from(list(Phase)), max_size=12))
def test_a_window_moves_only_as_the_table_says(tries: list[Phase]) -> None:
    told: list[tuple[Phase, str | None]] = []
    run = new_run(told)
    path = [run.phase]
    for to in tries:
        before = run.phase
        if to in MOVES[before]:
            move(run, to)
            path.append(to)
        else:
            with pytest.raises(aprof.WindowStateError, match=f"from {before.value} to {to.value}"):
                move(run, to)
        assert run.record.state == manifest_state(run.phase)
    assert [phase for phase, _ in told] == path[1:]  # every move told once, in order
    if run.phase in (Phase.DONE, Phase.FAILED, Phase.TIMEOUT):
        assert run.record.stopped_ns is not None


def test_the_manifest_state_is_running_until_a_final_phase() -> None:
    assert {manifest_state(p) for p in Phase if not p.final} == {"running"}
    assert [manifest_state(p) for p in Phase if p.final] == ["done", "failed", "timeout", "skipped"]


@pytest.mark.parametrize(
    ("path", "seen"),
    [
        ([], "queued"),
        ([Phase.STARTING], "starting"),
        ([Phase.STARTING, Phase.ACTIVE], "active"),
        ([Phase.STARTING, Phase.ACTIVE, Phase.STOPPING], "ended"),
        ([Phase.STARTING, Phase.ACTIVE, Phase.STOPPING, Phase.DONE], "ended"),
        ([Phase.STARTING, Phase.FAILED], "failed"),  # requests that waited were gated only
        ([Phase.FAILED], "ended"),  # never started (a disk that refuses the manifest)
    ],
)
async def test_other_processes_see_a_phase_derived_from_the_windows(
    path: list[Phase], seen: str
) -> None:
    run = new_run()
    if path and path[0] is Phase.STARTING:
        run.start_task = asyncio.get_running_loop().create_task(asyncio.sleep(0))
        await run.start_task
    for to in path:
        move(run, to)
    assert shared_phase(run) == seen


def test_requests_are_counted_gated_while_starting_and_captured_while_active() -> None:
    class Req:
        gated = captured = False

    run = new_run()
    assert not run.admit(Req())  # queued: goes ungated and uncounted
    run.begin_start()
    waiting = Req()
    assert run.admit(waiting) and waiting.gated  # type: ignore[arg-type]
    run.activate(None)
    captured = Req()
    assert not run.admit(captured) and captured.captured  # type: ignore[arg-type]
    run.add_counts(3, 1)  # from another process
    run.write_counts()
    assert (run.record.requests.admitted, run.record.requests.gated) == (5, 2)


def test_a_failure_reaches_a_strict_caller_once() -> None:
    run = new_run()
    run.begin_start()
    assert run.failure_to_raise() is None
    run.end(Phase.FAILED, "start failed: boom", reason="error")
    assert run.failure_to_raise() == (3, "replica_0", "start failed: boom")
    assert run.failure_to_raise() is None
    assert run.record.stop_reason == "error"


def test_no_module_but_the_windows_writes_a_windows_phase_or_state() -> None:
    writes = []
    for path in sorted((ROOT / "aprof").rglob("*.py")):
        if path == ROOT / "aprof" / "_core" / "window_machine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AugAssign | ast.AnnAssign)
                else []
            )
            for target in targets:
                parts = target.elts if isinstance(target, ast.Tuple) else [target]
                for part in parts:
                    if isinstance(part, ast.Attribute) and part.attr in WRITTEN_ONLY_BY_THE_WINDOW:
                        writes.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(part)}"
                        )
    assert not writes, "\n".join(writes)
