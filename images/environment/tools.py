"""The tools the reference environment answers on /v1/step, for `rollout.tools.remote` (the
runtime's tools/environment.py sends a call's name and arguments as the step's metadata). Stdlib
only.

- `python` {"code": "..."}: the code runs in the sandbox (sandbox.py); the observation is its
  stdout, or its stderr's last 2000 characters when it fails ("timed out" at the wall clock);
- `calculator` {"expression": "..."}: numbers, + - * / // % ** and parentheses, evaluated from the
  expression's syntax tree (never `eval`), exponents and results bounded, as the runtime's in-process
  calculator (rlkube.runtime.tools.calculator).

A call the policy got wrong (an unknown tool, missing or bad arguments, code that raises) is
answered with an error as the observation: the policy's mistake, scored by the reward. Only the
server's own failures are HTTP errors.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e18
MAX_EXPRESSION = 200
ERROR_TAIL = 2000


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


def calculator(arguments: dict) -> str:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return 'error: calculator takes {"expression": "<arithmetic>"}'
    if len(expression) > MAX_EXPRESSION:
        return f"error: expression longer than {MAX_EXPRESSION} characters"
    try:
        value = _value(ast.parse(expression, mode="eval").body)
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        return f"error: {e}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def python(arguments: dict, run: Callable) -> str:
    """`run(code)` is the server's sandbox (a SandboxResult)."""
    code = arguments.get("code")
    if not isinstance(code, str):
        return 'error: python takes {"code": "<python source>"}'
    result = run(code)
    if result.ok:
        return result.stdout
    return result.stderr[-ERROR_TAIL:] or ("timed out" if result.timed_out else f"exit code {result.exit_code}")


TOOL_NAMES = ("calculator", "python")


def answer_call(name: str, arguments: dict, run: Callable) -> str:
    """The observation of one tool call."""
    if not isinstance(arguments, dict):
        return "error: arguments must be an object"
    if name == "calculator":
        return calculator(arguments)
    if name == "python":
        return python(arguments, run)
    return f"error: unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}"
