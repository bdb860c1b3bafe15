"""A task whose first step runs at once, inside the call that makes it.

asyncio runs a new task after every task already ready. A window's start made an ordinary task
by the step's first request therefore began only after the whole wave of agent loops already
ready had come to the window's gate and waited for it: with 10,000 loops, a pass over all of
them (docs/benchmarks.md). Python 3.12's eager tasks do what is needed here; 3.11 has none, so
:func:`start_task` runs the coroutine's first step itself, as the new task (in the task's
context, and with the task as ``asyncio.current_task()``, which timeouts and HTTP clients bind
to), and the task goes on from where that step stopped. Where asyncio lacks the hooks this
needs, the task starts as any other.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

_T = TypeVar("_T")

_enter = getattr(asyncio.tasks, "_enter_task", None)
_leave = getattr(asyncio.tasks, "_leave_task", None)


class _Begun(Coroutine[Any, Any, _T]):
    """A coroutine whose first step has run: its task's first step gets that step's outcome,
    the later ones go to the coroutine."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, _T]) -> None:
        self._coro = coro
        self._first: tuple[str, Any] | None = None
        """``("yield", value)``, ``("return", value)`` or ``("raise", exc)``; ``None`` once
        handed over."""

    def send(self, value: Any) -> Any:
        first, self._first = self._first, None
        if first is None:
            return self._coro.send(value)
        kind, outcome = first
        if kind == "yield":
            return outcome
        if kind == "return":
            raise StopIteration(outcome)
        raise outcome

    def throw(self, exc: Any, value: Any = None, traceback: Any = None) -> Any:
        first, self._first = self._first, None
        error = exc if value is None else value
        if first is not None and first[0] != "yield":
            raise error  # the coroutine ended in its first step: what comes is the task's
        return self._coro.throw(error)

    def close(self) -> None:
        self._first = None
        self._coro.close()

    def __await__(self) -> Generator[Any, None, _T]:
        return self._coro.__await__()


def start_task(coro: Coroutine[Any, Any, _T], *, name: str) -> asyncio.Task[_T]:
    """A task running ``coro`` in a copy of the current context, its first step (up to its
    first wait) run before this returns."""
    loop = asyncio.get_running_loop()
    if _enter is None or _leave is None:
        return loop.create_task(coro, name=name)
    begun = _Begun(coro)
    context = contextvars.copy_context()
    task = loop.create_task(begun, name=name, context=context)
    current = asyncio.current_task(loop)
    if current is not None:
        _leave(loop, current)
    try:  # the caller's task is its loop's current one again, whatever happens here
        _enter(loop, task)
        try:
            begun._first = ("yield", context.run(coro.send, None))
        except StopIteration as stop:
            begun._first = ("return", stop.value)
        except BaseException as exc:  # the task's outcome, as if its own step had raised it
            begun._first = ("raise", exc)
        finally:
            _leave(loop, task)
    finally:
        if current is not None:
            _enter(loop, current)
    return task
