"""A stub tool for examples and tests: `calculator` evaluates arithmetic.

    <tool_call>{"name": "calculator", "arguments": {"expression": "(2 + 3) * 4"}}</tool_call>
    -> "20"

Numbers, + - * / // % ** and parentheses only, evaluated from the expression's syntax tree (never
`eval`), with exponents and results bounded. A call the policy got wrong (another tool's name, no
expression, bad syntax, division by zero) is answered with an error message, not raised: raising
is for the executor's own failures (tools/executor.py).
"""

from __future__ import annotations

import ast
import operator

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e18
MAX_EXPRESSION = 200


def _value(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent above {MAX_EXPONENT}")
        out = _BINARY[type(node.op)](left, right)
        if abs(out) > MAX_MAGNITUDE:
            raise ValueError("result too large")
        return out
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text (an int when it is one)."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    value = _value(ast.parse(expression, mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def calculator(name: str, arguments: dict) -> str:
    """The tool function of `rollout.tools.function: rlkube.runtime.tools.calculator:calculator`."""
    if name != "calculator":
        return f"error: unknown tool {name!r}; the only tool is 'calculator'"
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return 'error: calculator takes {"expression": "<arithmetic>"}'
    try:
        return evaluate(expression)
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"
