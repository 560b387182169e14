"""Tools of multi-turn rollouts: what answers the policy's tool calls, and how calls and their
outputs are written in the conversation.

- `executor`: the `ToolExecutor` seam (`step(episode_id, call) -> ToolResult`) and its in-process
  implementation from a Python function named in `rollout.tools.function`.
- `environment`: the executor of `rollout.tools.remote`, over the job's environment service
  (POST /v1/step).
- `calls`: the tool-call format the policy writes (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`)
  and its parser.
- `turns`: the tokens of a tool turn, from the tokenizer's chat template.
- `calculator`: a stub tool for examples and tests.

Host-only code (no torch): the trainer's multi-turn rollout (trainers/rl/multi_turn.py) drives it.
"""

from rlkube.runtime.tools.calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, MalformedToolCall, parse_tool_call
from rlkube.runtime.tools.executor import (
    FunctionTools,
    ToolCall,
    ToolExecutor,
    ToolFunction,
    ToolResult,
    load_tool_executor,
    step_all,
)
from rlkube.runtime.tools.turns import ToolTurnFormat

__all__ = [
    "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "FunctionTools", "MalformedToolCall", "ToolCall", "ToolExecutor",
    "ToolFunction", "ToolResult", "ToolTurnFormat", "load_tool_executor", "parse_tool_call", "step_all",
]
