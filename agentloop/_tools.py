"""Tools: named async callables a tool-using loop can call."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, overload

ToolFn = Callable[..., Awaitable[str]]
"""An async function taking the call's arguments as keywords and returning text."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Tool:
    """An async callable with a name the model calls it by."""

    name: str
    fn: ToolFn
    description: str = ""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"a tool name is a letter or '_' then up to 63 of [A-Za-z0-9_.-], got {self.name!r}"
            )
        call = type(self.fn).__call__  # async callable objects are tools too
        if not (inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(call)):
            raise TypeError(f"tool {self.name!r}: fn must be an async function")

    async def __call__(self, **arguments: Any) -> str:
        """Run the tool with ``arguments``; what the function raises propagates."""
        return await self.fn(**arguments)


@overload
def tool(fn: ToolFn, /) -> Tool: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[ToolFn], Tool]: ...


def tool(
    fn: ToolFn | None = None, /, *, name: str | None = None, description: str | None = None
) -> Tool | Callable[[ToolFn], Tool]:
    """Make an async function a :class:`Tool`: ``@tool`` or ``@tool(name=..., description=...)``.

    The name defaults to the function's name, the description to its docstring's first line.
    """

    def wrap(f: ToolFn) -> Tool:
        doc = (inspect.getdoc(f) or "").strip().splitlines()
        return Tool(
            name=name or f.__name__,
            fn=f,
            description=description if description is not None else (doc[0] if doc else ""),
        )

    return wrap if fn is None else wrap(fn)
