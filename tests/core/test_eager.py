"""``start_task``: a task whose first step runs inside the call that makes it, as that task (its
context, ``asyncio.current_task()``), and which then goes on as any task: results, errors,
timeouts and cancellation, before and after its first step."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from aprof._core.eager import start_task

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="caller")


async def test_the_first_step_runs_before_start_task_returns_as_the_task() -> None:
    steps: list[str] = []

    async def body() -> int:
        steps.append(asyncio.current_task().get_name())  # type: ignore[union-attr]
        seen.set("task")
        return 5

    caller = asyncio.current_task()
    task = start_task(body(), name="eager")
    assert steps == ["eager"]  # ran already, as the task
    assert asyncio.current_task() is caller and seen.get() == "caller"  # the caller's again
    assert await task == 5


async def test_a_task_that_waits_goes_on_and_its_timeout_is_its_own() -> None:
    async def body() -> str:
        me = asyncio.current_task()
        async with asyncio.timeout(0.01):  # bound in the first step: to this task
            await asyncio.Event().wait()
        raise AssertionError(f"not timed out: {me}")

    task = start_task(body(), name="waits")
    assert not task.done()
    with pytest.raises(TimeoutError):
        await task
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_an_error_of_the_first_step_is_the_tasks() -> None:
    async def body() -> None:
        raise ValueError("at once")

    task = start_task(body(), name="fails")
    with pytest.raises(ValueError, match="at once"):
        await task


@pytest.mark.parametrize("after_first_pass", [False, True])
async def test_cancelled_before_or_after_its_first_turn_of_the_loop(after_first_pass: bool) -> None:
    cleaned: list[bool] = []

    async def body() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    task = start_task(body(), name="cancelled")
    if after_first_pass:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled() and cleaned == [True]
