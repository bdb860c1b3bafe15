"""What an agent loop works on and what it returns: samples, turns, tool calls, trajectories."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentloop._client import Completion


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt to roll out."""

    id: str
    """Identifies the rollout; request ids and timeline spans are derived from it."""
    prompt: str
    """The text the first turn completes."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """Anything else the loop needs (a reference answer, a task kind)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call returned, or why it failed."""

    call: ToolCall
    content: str | None = None
    """The tool's answer."""
    error: str | None = None
    """Why the call failed (unknown tool, bad arguments, an exception, a timeout)."""

    @property
    def ok(self) -> bool:
        """The tool answered."""
        return self.error is None


@dataclass(slots=True)
class Turn:
    """One model call of a trajectory and the tool calls it led to."""

    index: int
    """0 for the first turn."""
    completion: Completion
    tool_results: list[ToolResult] = field(default_factory=list)
    observation: str = ""
    """The text appended to the prompt after this turn's completion (formatted tool results)."""

    @property
    def text(self) -> str:
        """The generated text."""
        return self.completion.text

    @property
    def replica(self) -> int:
        """The replica that generated this turn."""
        return self.completion.replica

    @property
    def step(self) -> int | None:
        """The global step this turn's request was admitted in."""
        return self.completion.step


@dataclass(slots=True)
class Trajectory:
    """A rollout of one sample: its turns, and the error that ended it early, if any."""

    sample: Sample
    step: int | None
    """The global step the rollout began in (``None`` without a profiler or outside a step)."""
    turns: list[Turn] = field(default_factory=list)
    error: Exception | None = None
    """What ended the rollout early (an :class:`agentloop.LLMError` when a request failed)."""

    @property
    def id(self) -> str:
        """The sample's id."""
        return self.sample.id

    @property
    def ok(self) -> bool:
        """The rollout ended without an error."""
        return self.error is None

    @property
    def replica(self) -> int | None:
        """The replica of the latest turn; the next turn prefers it."""
        return self.turns[-1].replica if self.turns else None

    @property
    def response(self) -> str:
        """Everything after the prompt: each turn's text followed by its observation."""
        return "".join(turn.text + turn.observation for turn in self.turns)
