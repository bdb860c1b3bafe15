"""Tools (calculator, search, the decorator) and tool-call parsers."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentloop import (
    CORPUS,
    CalculatorError,
    HermesParser,
    ScriptedToolCalls,
    Tool,
    ToolCall,
    calculator,
    evaluate,
    make_search,
    search,
    tool,
)

numbers = st.integers(-50, 50).map(str) | st.floats(0.5, 50, allow_nan=False).map(repr)
expressions = st.recursive(
    numbers,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(inner, st.integers(0, 3)).map(lambda t: f"({t[0]}) ** {t[1]}"),
        inner.map(lambda e: f"-{e}"),
    ),
    max_leaves=8,
)


@given(expressions)
def test_calculator_agrees_with_python_arithmetic(expression: str) -> None:
    try:
        expected: object = eval(expression, {"__builtins__": {}})  # the oracle, on generated text
    except ZeroDivisionError:
        with pytest.raises(CalculatorError, match="division by zero"):
            evaluate(expression)
        return
    except OverflowError:
        with pytest.raises(CalculatorError):
            evaluate(expression)
        return
    if isinstance(expected, complex) or (isinstance(expected, float) and expected != expected):
        with pytest.raises(CalculatorError):
            evaluate(expression)
        return
    try:
        got = evaluate(expression)
    except CalculatorError as exc:
        assert "too large" in str(exc) or "not finite" in str(exc)
        return
    assert got == expected


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os')", "Call is not allowed"),
        ("x + 1", "Name is not allowed"),
        ("(1).real", "Attribute is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1 < 2", "Compare is not allowed"),
        ("2 ** 5000", "exponents beyond"),
        ("99 ** 999", "too large"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an expression"),
        ("1" * 201, "longer than"),
    ],
)
def test_calculator_refuses_anything_but_bounded_arithmetic(expression: str, why: str) -> None:
    with pytest.raises(CalculatorError, match=why):
        evaluate(expression)


async def test_calculator_tool_answers_text() -> None:
    assert calculator.name == "calculator"
    assert await calculator(expression="(2 + 3) * 4 - 7 / 2") == "16.5"


async def test_search_ranks_by_shared_words_and_says_when_nothing_matches() -> None:
    assert (await search(query="prefix cache reuse")).startswith("prefix cache: ")
    assert await search(query="zebra") == "no results"
    two = make_search(CORPUS, delay_s=0, top_k=2)
    assert len((await two(query="sglang prefix cache radix")).splitlines()) == 2
    with pytest.raises(ValueError, match="delay_s"):
        make_search(delay_s=60)


async def test_tool_decorator_names_and_describes() -> None:
    @tool
    async def echo(text: str) -> str:
        """Say it back.

        More words."""
        return text

    @tool(name="shout", description="Loud.")
    async def loud(text: str) -> str:
        return text.upper()

    assert (echo.name, echo.description) == ("echo", "Say it back.")
    assert (loud.name, loud.description, await loud(text="hi")) == ("shout", "Loud.", "HI")
    with pytest.raises(ValueError, match="tool name"):
        Tool(name="no spaces", fn=loud.fn)
    with pytest.raises(TypeError, match="async"):
        Tool(name="sync", fn=lambda: "x")  # type: ignore[arg-type,return-value]

    class Counter:
        async def __call__(self, n: int) -> str:
            return str(n + 1)

    assert await Tool(name="count", fn=Counter())(n=1) == "2"


def test_hermes_parser_reads_every_well_formed_block() -> None:
    text = (
        'think <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>\n{"name": "search"}\n</tool_call>'
    )
    assert HermesParser().parse(text, turn=0) == [
        ToolCall("calculator", {"expression": "1+1"}),
        ToolCall("search", {}),
    ]
    as_string = '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"q\\"}"}</tool_call>'
    assert HermesParser().parse(as_string, turn=0) == [ToolCall("search", {"query": "q"})]
    assert HermesParser().parse("no calls here", turn=0) == []


async def test_scripted_calls_are_deterministic_cycle_tools_and_stop() -> None:
    parser = ScriptedToolCalls(3)
    first = parser.parse("abc", turn=0)
    assert first == parser.parse("abc", turn=0) and first != parser.parse("abd", turn=0)
    assert [c.name for t in range(4) for c in parser.parse("abc", turn=t)] == [
        "calculator",
        "search",
        "calculator",
    ]
    [call] = first
    assert await asyncio.wait_for(calculator(**call.arguments), 5) == str(
        evaluate(call.arguments["expression"])
    )
    [query] = parser.parse("abc", turn=1)
    assert await search(**query.arguments) != "no results"


def test_hermes_parser_skips_a_block_nested_too_deep_to_decode() -> None:
    # json.loads raises RecursionError, not JSONDecodeError, for nesting this deep; a model's
    # runaway output must not fail the rollout.
    deep = "[" * 100_000
    text = (
        f"<tool_call>{deep}</tool_call>"
        f'<tool_call>{{"name": "search", "arguments": "{deep}"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
    )
    assert HermesParser().parse(text, turn=0) == [ToolCall("search", {"query": "q"})]
