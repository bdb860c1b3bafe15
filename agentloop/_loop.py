"""Agent loops: the base class, a single-turn loop and a multi-turn tool-calling loop."""

from __future__ import annotations

import asyncio
import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Protocol

import structlog

from agentloop import _dialects
from agentloop._client import LLMClient
from agentloop._errors import LLMError
from agentloop._parsers import HermesParser, ToolCallParser
from agentloop._tools import Tool
from agentloop._trajectory import Sample, ToolCall, ToolResult, Trajectory, Turn

SpanValue = str | int | float | bool | None
"""A value a timeline span can carry."""

_log = structlog.get_logger("agentloop")


class SpanFactory(Protocol):
    """What :attr:`AgentLoop.span` gives: call it with a name and attrs for a ``with``."""

    def __call__(
        self, name: str, /, **attrs: SpanValue
    ) -> contextlib.AbstractContextManager[object]: ...


_NULL = contextlib.nullcontext()


def _no_span(name: str, /, **attrs: SpanValue) -> contextlib.nullcontext[None]:
    return _NULL  # it keeps no state: one serves every span


class AgentLoop(ABC):
    """One rollout of a sample. Subclass it and implement :meth:`run`.

    The helpers keep the bookkeeping out of ``run``: :meth:`trajectory` opens the record of a
    rollout (an error inside ends it and is written into it), :meth:`generate` runs one turn
    on the trajectory's replica and records it, :attr:`span` marks a stretch on aprof's
    timeline.
    """

    def __init__(
        self,
        llm: LLMClient,
        *,
        max_tokens: int = 64,
        temperature: float | None = None,
        stop: str | Sequence[str] = (),
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.llm = llm
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stop = tuple(_dialects.stop_strings(stop))

    @abstractmethod
    async def run(self, sample: Sample) -> Trajectory:
        """Roll out ``sample``; failures belong in the trajectory, not raised."""

    @contextlib.asynccontextmanager
    async def trajectory(self, sample: Sample) -> AsyncIterator[Trajectory]:
        """``async with self.trajectory(sample) as traj:`` — the record of one rollout.

        An exception inside the block ends the rollout: it is stored in ``traj.error`` and
        not raised (cancellation is not caught).
        """
        prof = self.llm.prof
        traj = Trajectory(sample=sample, step=None if prof is None else prof.current_step)
        try:
            yield traj
        except LLMError as exc:
            traj.error = exc
            _log.info(
                "trajectory failed", trajectory=traj.id, turns=len(traj.turns), error=str(exc)
            )
        except Exception as exc:
            traj.error = exc
            _log.exception("trajectory raised", trajectory=traj.id, turns=len(traj.turns))

    async def generate(self, traj: Trajectory, prompt: str) -> Turn:
        """Complete ``prompt`` as the next turn of ``traj`` (on its replica while that is up).

        Raises :class:`LLMError` when the request fails.
        """
        index = len(traj.turns)
        completion = await self.llm.generate(
            prompt,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            stop=self.stop,
            prefer=traj.replica,
            request_id=f"{traj.id}-t{index}",
            trajectory=traj.id,
            turn=index,
        )
        turn = Turn(index=index, completion=completion)
        traj.turns.append(turn)
        return turn

    @property
    def span(self) -> SpanFactory:
        """``with self.span(name, **attrs):`` a span on the profiler's timeline (nothing
        without a profiler)."""
        # The profiler's own method, not a method that passes the attrs on to it: a second
        # call with **attrs doubled what a span costs an agent loop's turn.
        prof = self.llm.prof
        if prof is None:
            return _no_span
        return prof.span


class SingleTurnLoop(AgentLoop):
    """One completion of the sample's prompt."""

    async def run(self, sample: Sample) -> Trajectory:
        """Roll out ``sample`` in one turn."""
        async with self.trajectory(sample) as traj:
            with self.span("turn", trajectory=traj.id, turn=0):
                await self.generate(traj, sample.prompt)
        return traj


class ToolAgentLoop(AgentLoop):
    """Generate, run the tool calls found in the text, append their results, repeat.

    The loop ends after a turn without tool calls or after ``max_turns`` turns. Calls of one
    turn run concurrently, each bounded by ``tool_timeout_s``; a failing call (unknown tool,
    bad arguments, an exception, a timeout) answers the model with its error instead of
    ending the rollout. Results are appended Hermes-style, one
    ``<tool_response>...</tool_response>`` block per call (override :meth:`observe`).
    """

    def __init__(
        self,
        llm: LLMClient,
        tools: Iterable[Tool],
        *,
        parser: ToolCallParser | None = None,
        max_turns: int = 4,
        tool_timeout_s: float = 30.0,
        max_tokens: int = 64,
        temperature: float | None = None,
        stop: str | Sequence[str] = (),
    ) -> None:
        super().__init__(llm, max_tokens=max_tokens, temperature=temperature, stop=stop)
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not 0 < tool_timeout_s < math.inf:
            raise ValueError(f"tool_timeout_s must be a positive number, got {tool_timeout_s!r}")
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.parser: ToolCallParser = parser if parser is not None else HermesParser()
        self.max_turns = max_turns
        self.tool_timeout_s = tool_timeout_s

    async def run(self, sample: Sample) -> Trajectory:
        """Roll out ``sample`` over up to ``max_turns`` turns."""
        async with self.trajectory(sample) as traj:
            prompt = sample.prompt
            for index in range(self.max_turns):
                with self.span("turn", trajectory=traj.id, turn=index):
                    turn = await self.generate(traj, prompt)
                    calls = self.parser.parse(turn.text, turn=index)
                    if calls:
                        turn.tool_results = await self.call_tools(calls)
                        turn.observation = self.observe(turn.tool_results)
                if not calls:
                    break
                prompt += turn.text + turn.observation
        return traj

    async def call_tools(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` concurrently; their results in the same order."""
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self.call_tool(call)) for call in calls]
        return [task.result() for task in tasks]

    async def call_tool(self, call: ToolCall) -> ToolResult:
        """Run one call; any failure becomes the result's ``error``."""
        tool = self.tools.get(call.name)
        with self.span("tool_call", tool=call.name):
            if tool is None:
                return ToolResult(call, error=f"unknown tool {call.name!r}")
            try:
                async with asyncio.timeout(self.tool_timeout_s):
                    content = await tool(**call.arguments)
            except TimeoutError:
                return ToolResult(call, error=f"no answer within {self.tool_timeout_s:g} s")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the rollout is being cancelled
                # The tool's own (it awaited something cancelled elsewhere): a failed call,
                # not a rollout that vanishes from its batch.
                return ToolResult(call, error="CancelledError: the tool was cancelled")
            except Exception as exc:  # the model sees the error and may try again
                return ToolResult(call, error=f"{type(exc).__name__}: {exc}")
        return ToolResult(call, content=content)

    def observe(self, results: Sequence[ToolResult]) -> str:
        """The text appended to the prompt for a turn's tool results."""
        blocks = []
        for result in results:
            body = result.content if result.ok else f"error: {result.error}"
            blocks.append(f"\n<tool_response>\n{body}\n</tool_response>\n")
        return "".join(blocks)
