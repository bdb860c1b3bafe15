"""The ``calculator`` tool: arithmetic evaluated over the syntax tree, never with ``eval``."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from agentloop._errors import CalculatorError
from agentloop._tools import Tool

MAX_CHARS = 200
"""Longest expression accepted."""
MAX_INT_BITS = 4096
"""Largest integer magnitude (in bits) any intermediate result may have."""
MAX_EXPONENT = 1024
"""Largest absolute exponent of ``**``."""

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, ``+ - * / // % **`` and parentheses.

    Raises :class:`CalculatorError` for anything else, division by zero, or results too large.
    """
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an expression: {exc.msg}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, got {value!r}")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
        if isinstance(result, complex):
            raise CalculatorError("the result is not a real number")
        return _checked(result)
    raise CalculatorError(f"{type(node).__name__} is not allowed in arithmetic")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponents beyond ±{MAX_EXPONENT} are not allowed")
    # Refuse an integer power too large to hold before computing it, not after.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and (abs(base).bit_length() - 1) * exponent >= MAX_INT_BITS
    ):
        raise CalculatorError("the result is too large")


def _checked(value: int | float) -> int | float:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalculatorError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not finite")
    return value


async def _calculate(expression: str) -> str:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."""
    return str(evaluate(expression))


calculator = Tool(
    name="calculator",
    fn=_calculate,
    description="Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
)
"""The calculator tool; its argument is ``expression``."""
