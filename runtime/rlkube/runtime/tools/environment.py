"""A `ToolExecutor` answered by the job's environment service (`roles.environment`, POST /v1/step):
the seam between multi-turn rollouts and the environment protocol (docs/environments.md).

Each tool call is one step of its episode: the call's raw text is the step's `action`, its name and
arguments go along as metadata, the environment's `observation` is the tool turn and its `done`
ends the episode. A call that still fails after the client's retries (rewards/remote.py) is a
failed call (`ok` False: the episode is masked out of the loss and counted), never an answer. The
trainer does not pick this executor from the config yet; `EnvironmentTools(connect_environment())`
is what a `rollout.tools` setting naming the environment would build.
"""

from __future__ import annotations

from rlkube.runtime.rewards.remote import CallFailed, EnvironmentClient
from rlkube.runtime.tools.executor import ToolCall, ToolResult


class EnvironmentTools:
    """Tool calls answered by POST /v1/step of an environment service."""

    def __init__(self, client: EnvironmentClient) -> None:
        self.client = client

    def step(self, episode_id: str, call: ToolCall) -> ToolResult:
        try:
            answer = self.client.step(episode_id, call.text, {"name": call.name, "arguments": call.arguments})
        except CallFailed as failure:
            return ToolResult(text=f"environment: {failure}", ok=False)
        return ToolResult(text=answer["observation"], done=answer["done"])
