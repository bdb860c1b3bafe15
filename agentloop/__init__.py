"""agentloop: the asyncio AgentLoop runtime that drives inference servers through aprof.

The front door: every public name is defined in a private module named for what it holds.
"""

from agentloop._balancer import ReplicaBalancer
from agentloop._calculator import calculator, evaluate
from agentloop._client import Completion, LLMClient
from agentloop._dialects import Api
from agentloop._errors import CalculatorError, FailureKind, LLMError, PromptError
from agentloop._loop import AgentLoop, SingleTurnLoop, ToolAgentLoop
from agentloop._parsers import HermesParser, ScriptedToolCalls, ToolCallParser
from agentloop._runner import AgentLoopRunner, RolloutStream
from agentloop._search import CORPUS, make_search, search
from agentloop._tools import Tool, tool
from agentloop._trajectory import Sample, ToolCall, ToolResult, Trajectory, Turn

__all__ = [
    "CORPUS",
    "AgentLoop",
    "AgentLoopRunner",
    "Api",
    "CalculatorError",
    "Completion",
    "FailureKind",
    "HermesParser",
    "LLMClient",
    "LLMError",
    "PromptError",
    "ReplicaBalancer",
    "RolloutStream",
    "Sample",
    "ScriptedToolCalls",
    "SingleTurnLoop",
    "Tool",
    "ToolAgentLoop",
    "ToolCall",
    "ToolCallParser",
    "ToolResult",
    "Trajectory",
    "Turn",
    "calculator",
    "evaluate",
    "make_search",
    "search",
    "tool",
]
