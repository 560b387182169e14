"""The tools the reference environment answers on /v1/step, for `rollout.tools.remote` (the
runtime's tools/environment.py sends a call's name and arguments as the step's metadata). Stdlib
only.

- `python` {"code": "..."}: the code runs in the sandbox (sandbox.py); the observation is its
  stdout, or its stderr's last 2000 characters when it fails ("timed out" at the wall clock);
- `calculator` {"expression": "..."}: the runtime's in-process calculator
  (runtime/rlkube/runtime/tools/calculator.py, stdlib only, copied into the image beside this file):
  numbers, + - * / // % ** and parentheses from the expression's syntax tree (never `eval`).

A call the policy got wrong (an unknown tool, missing or bad arguments, code that raises) is
answered with an error as the observation: the policy's mistake, scored by the reward. Only the
server's own failures are HTTP errors.
"""

from __future__ import annotations

from collections.abc import Callable

try:  # in the image: the runtime's calculator, copied beside this file (Dockerfile)
    from calculator import calculator as _calculator
except ImportError:  # in the repository: the same module in the runtime's package
    from rlkube.runtime.tools.calculator import calculator as _calculator

ERROR_TAIL = 2000


def calculator(arguments: dict) -> str:
    """The runtime's in-process calculator tool (rlkube.runtime.tools.calculator), one definition."""
    return _calculator("calculator", arguments)


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
