"""The tool-executor seam: what answers a policy's tool call inside an episode.

`ToolExecutor.step(episode_id, call) -> ToolResult` is the whole protocol. `episode_id` names one
episode (one row of one rollout) for executors that keep state per episode (an environment
service's sandbox); `call` is the parsed call. The result's `text` is appended to the conversation
as a tool turn; `done` ends the episode at the call (no turn of the policy would read the text,
so it is not appended); `ok` False says the
executor failed (a timeout, a crash of its own, a call that still failed after the executor's own
retries) rather than the policy: such an episode is masked out of the loss and counted, never
scored as 0, since its reward would say nothing about the policy.

A call the policy got wrong (an unknown tool, bad arguments) is not a failure: the executor
answers it with an error message as `text` (ok stays True), and the policy learns from the reward.

`FunctionTools` is the in-process executor: a Python function `function(name, arguments) -> str |
ToolResult` named in the config as 'package.module:function' (`rollout.tools.function`), as a
rule-based reward is (`roles.reward.function`). An exception it raises is a failed call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlkube.runtime.rewards.functions import load_function


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the policy wrote it: the tool's name, its arguments and the raw text
    between the tags."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer: `text` (appended as the tool turn), `done` (end the episode at the call),
    `ok` (False: the executor failed; the episode is masked out of the loss and counted)."""

    text: str
    done: bool = False
    ok: bool = True


class ToolExecutor(Protocol):
    """Answers the tool calls of episodes."""

    def step(self, episode_id: str, call: ToolCall) -> ToolResult: ...


def step_all(executor: ToolExecutor, calls: list[tuple[str, ToolCall]]) -> list[ToolResult]:
    """The executor's results of the (episode_id, call) pairs, in order: at once where the executor
    has `step_many` (a remote one, whose calls wait on the network), else one after another. A call
    whose step raises is a failed call (ok False)."""
    many = getattr(executor, "step_many", None)
    if many is not None:
        try:
            results = list(many(calls))
        except Exception as e:  # the executor's own failure (its retries spent): every call of it failed
            return [ToolResult(text=f"{type(e).__name__}: {e}", ok=False)] * len(calls)
        if len(results) != len(calls):
            return [ToolResult(text=f"step_many answered {len(results)} of {len(calls)} calls", ok=False)] * len(calls)
        return results
    out = []
    for episode_id, call in calls:
        try:
            out.append(executor.step(episode_id, call))
        except Exception as e:  # the executor's own failure (its retries spent): masked out, counted
            out.append(ToolResult(text=f"{type(e).__name__}: {e}", ok=False))
    return out


ToolFunction = Callable[[str, dict], "str | ToolResult"]


class FunctionTools:
    """A `ToolExecutor` from an in-process function(name, arguments) -> str | ToolResult."""

    def __init__(self, function: ToolFunction) -> None:
        self.function = function

    def step(self, episode_id: str, call: ToolCall) -> ToolResult:
        try:
            out = self.function(call.name, call.arguments)
        except Exception as e:  # the tool's own failure, not the policy's: masked out, counted
            return ToolResult(text=f"{type(e).__name__}: {e}", ok=False)
        if isinstance(out, ToolResult):
            return out
        if not isinstance(out, str):
            return ToolResult(text=f"rollout.tools.function returned {type(out).__name__}, not str", ok=False)
        return ToolResult(text=out)


def load_tool_executor(path: str) -> FunctionTools:
    """The in-process executor of the function named by 'package.module:function'; ValueError
    naming rollout.tools.function when it cannot be found."""
    return FunctionTools(load_function(path, "rollout.tools.function"))
