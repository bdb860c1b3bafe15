"""Agent loops against reference servers on 127.0.0.1: single turn, tool turns, failures."""

from __future__ import annotations

import asyncio

import pytest
from agentloop_replicas import ReplicaFactory, samples

from agentloop import (
    AgentLoop,
    AgentLoopRunner,
    Api,
    HermesParser,
    LLMClient,
    LLMError,
    Sample,
    ScriptedToolCalls,
    SingleTurnLoop,
    Tool,
    ToolAgentLoop,
    ToolCall,
    Trajectory,
    calculator,
    search,
    tool,
)

LIMIT_S = 30
DIALECTS = [("vllm", "openai", False), ("sglang", "sglang", False), ("sglang", "sglang", True)]
IDS = ["vllm-openai", "sglang-generate", "sglang-generate-stream"]


@pytest.mark.parametrize(("dialect", "api", "stream"), DIALECTS, ids=IDS)
async def test_single_turn_loop(
    replicas: ReplicaFactory, dialect: str, api: Api, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1, dialect=dialect) as [server],
        LLMClient([server.url], api=api, stream=stream) as llm,
    ):
        trajs = await AgentLoopRunner(SingleTurnLoop(llm, max_tokens=3)).run_batch(samples(3))
    assert [t.id for t in trajs] == ["s0", "s1", "s2"]
    for traj in trajs:
        assert traj.ok and traj.step is None
        [turn] = traj.turns
        assert (turn.index, turn.replica, turn.completion.completion_tokens) == (0, 0, 3)
        assert turn.completion.request_id == f"{traj.id}-t0"
        assert traj.response == turn.text and len(turn.text) == 3
    assert sorted(server.received) == ["s0-t0", "s1-t0", "s2-t0"]


@pytest.mark.parametrize(("dialect", "api", "stream"), DIALECTS, ids=IDS)
async def test_tool_loop_appends_tool_results_and_sticks_to_one_replica(
    replicas: ReplicaFactory, dialect: str, api: Api, stream: bool
) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(2, dialect=dialect) as [a, b],
        LLMClient([a.url, b.url], api=api, stream=stream) as llm,
    ):
        loop = ToolAgentLoop(
            llm, [calculator, search], parser=ScriptedToolCalls(2), max_turns=5, max_tokens=4
        )
        trajs = await AgentLoopRunner(loop, concurrency=6).run_batch(samples(6))
    for traj in trajs:
        assert traj.ok, traj.error
        assert [t.index for t in traj.turns] == [0, 1, 2]  # two tool turns, then a plain one
        assert len({t.replica for t in traj.turns}) == 1  # all turns on one prefix cache
        calc, found = traj.turns[0].tool_results[0], traj.turns[1].tool_results[0]
        assert (calc.call.name, found.call.name) == ("calculator", "search")
        assert calc.ok and found.ok and found.content != "no results"
        assert traj.turns[0].observation == f"\n<tool_response>\n{calc.content}\n</tool_response>\n"
        assert traj.turns[2].tool_results == [] and traj.turns[2].observation == ""
        prompt = traj.sample.prompt
        for turn in traj.turns:  # one token per character: the prompt grew by what was appended
            assert turn.completion.prompt_tokens == len(prompt)
            prompt += turn.text + turn.observation
    assert {t.replica for t in trajs} == {0, 1}
    assert len(a.received) + len(b.received) == 18


async def test_tool_loop_stops_at_max_turns(replicas: ReplicaFactory) -> None:
    async with (
        asyncio.timeout(LIMIT_S),
        replicas(1) as [server],
        LLMClient([server.url]) as llm,
    ):
        loop = ToolAgentLoop(
            llm, [calculator, search], parser=ScriptedToolCalls(10), max_turns=3, max_tokens=2
        )
        [traj] = await AgentLoopRunner(loop).run_batch(samples(1))
    assert traj.ok and len(traj.turns) == 3 and all(t.tool_results for t in traj.turns)
    assert len(server.received) == 3


async def test_default_parser_finds_no_call_in_random_text(replicas: ReplicaFactory) -> None:
    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        loop = ToolAgentLoop(llm, [calculator], max_tokens=8)
        [traj] = await AgentLoopRunner(loop).run_batch(samples(1))
    assert isinstance(loop.parser, HermesParser)
    assert traj.ok and len(traj.turns) == 1 and traj.turns[0].tool_results == []


class FixedCalls:
    """A parser that asks for the same calls on the first turn."""

    def __init__(self, calls: list[ToolCall]) -> None:
        self.calls = calls

    def parse(self, text: str, *, turn: int) -> list[ToolCall]:
        return self.calls if turn == 0 else []


async def test_failing_tool_calls_answer_the_model_with_their_error(
    replicas: ReplicaFactory,
) -> None:
    never = asyncio.Event()

    @tool
    async def broken(text: str) -> str:
        raise RuntimeError("tool is down")

    @tool
    async def stuck() -> str:
        await never.wait()  # cut short by the loop's tool timeout
        return "never"

    calls = [
        ToolCall("broken", {"text": "x"}),
        ToolCall("nope", {}),
        ToolCall("calculator", {"wrong": "1"}),
        ToolCall("stuck", {}),
        ToolCall("calculator", {"expression": "6 * 7"}),
    ]
    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        loop = ToolAgentLoop(
            llm,
            [broken, stuck, calculator],
            parser=FixedCalls(calls),
            tool_timeout_s=0.05,
            max_tokens=2,
        )
        [traj] = await AgentLoopRunner(loop).run_batch(samples(1))
    assert traj.ok and len(traj.turns) == 2
    results = traj.turns[0].tool_results
    assert [r.call for r in results] == calls  # in the order asked, though run concurrently
    assert results[0].error == "RuntimeError: tool is down"
    assert results[1].error == "unknown tool 'nope'"
    assert results[2].error is not None and "unexpected keyword argument" in results[2].error
    assert results[3].error == "no answer within 0.05 s"
    assert (results[4].ok, results[4].content) == (True, "42")
    assert "error: RuntimeError: tool is down" in traj.turns[0].observation


async def test_a_tool_raising_cancelled_error_of_its_own_is_a_failed_call(
    replicas: ReplicaFactory,
) -> None:
    # A tool awaiting work that someone else cancelled (a shared in-flight lookup) gets a
    # CancelledError although its rollout is not being cancelled: that is the tool failing.
    @tool
    async def shared(text: str) -> str:
        lookup = asyncio.get_running_loop().create_future()
        lookup.cancel()
        return str(await lookup)

    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        loop = ToolAgentLoop(
            llm, [shared], parser=ScriptedToolCalls(1, tools=["shared"]), max_tokens=2
        )
        trajs = await AgentLoopRunner(loop, concurrency=1).run_batch(samples(2))
    assert [t.id for t in trajs] == ["s0", "s1"]
    for traj in trajs:
        assert traj.ok and len(traj.turns) == 2
        assert traj.turns[0].tool_results[0].error == "CancelledError: the tool was cancelled"


async def test_cancelling_the_batch_cancels_a_tool_call_in_flight(
    replicas: ReplicaFactory,
) -> None:
    entered, never = asyncio.Event(), asyncio.Event()
    cancelled: list[str] = []

    @tool
    async def slow(text: str) -> str:
        entered.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.append(text)
            raise
        return "never"

    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        loop = ToolAgentLoop(llm, [slow], parser=ScriptedToolCalls(1, tools=["slow"]), max_tokens=2)
        batch = asyncio.create_task(AgentLoopRunner(loop).run_batch(samples(1)))
        await entered.wait()
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
    assert len(cancelled) == 1


async def test_a_failed_request_ends_the_trajectory_with_the_error(
    replicas: ReplicaFactory,
) -> None:
    # Turn 0 fits the 512-token context; the prompt of turn 1 does not: the server answers 400.
    prompt = "x" * 505
    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        loop = ToolAgentLoop(llm, [calculator], parser=ScriptedToolCalls(5), max_tokens=2)
        [traj] = await AgentLoopRunner(loop).run_batch([Sample("long", prompt)])
    assert len(traj.turns) == 1 and not traj.ok
    assert isinstance(traj.error, LLMError)
    assert (traj.error.kind, traj.error.status, traj.error.replica) == ("status", 400, 0)
    assert "maximum context length" in traj.error.cause


class Broken(AgentLoop):
    """Raises inside the trajectory for one sample and outside it for another."""

    async def run(self, sample: Sample) -> Trajectory:
        if sample.id == "outside":
            raise KeyError("not recorded by the loop")
        async with self.trajectory(sample) as traj:
            await self.generate(traj, sample.prompt)
            if sample.id == "inside":
                raise ValueError("bad reward")
        return traj


async def test_a_loop_that_raises_fails_its_rollout_only(replicas: ReplicaFactory) -> None:
    batch = [Sample(i, "hello") for i in ("inside", "outside", "fine")]
    async with asyncio.timeout(LIMIT_S), replicas(1) as [server], LLMClient([server.url]) as llm:
        inside, outside, fine = await AgentLoopRunner(Broken(llm, max_tokens=2)).run_batch(batch)
    assert isinstance(inside.error, ValueError) and len(inside.turns) == 1
    assert isinstance(outside.error, KeyError) and outside.turns == []
    assert fine.ok and len(fine.turns) == 1


def test_loop_arguments_are_checked() -> None:
    llm = LLMClient(["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="max_turns"):
        ToolAgentLoop(llm, [], max_turns=0)
    with pytest.raises(ValueError, match="tool_timeout_s"):
        ToolAgentLoop(llm, [], tool_timeout_s=0)
    with pytest.raises(ValueError, match="two tools"):
        ToolAgentLoop(llm, [calculator, Tool("calculator", calculator.fn)])
    with pytest.raises(ValueError, match="max_tokens"):
        SingleTurnLoop(llm, max_tokens=0)
