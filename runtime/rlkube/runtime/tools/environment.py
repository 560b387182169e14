"""A `ToolExecutor` answered by the job's environment service (`roles.environment`, POST /v1/step):
the executor of `rollout.tools.remote: true` (docs/environments.md, docs/multi-turn.md).

Each tool call is one step of its episode: the call's raw text is the step's `action`, its name and
arguments go along as metadata, the environment's `observation` is the tool turn and its `done`
ends the episode. An episode's steps go to one replica (the client hashes the episode id over the
replicas' addresses), since an environment keeps its episodes in memory. A call that still fails
after the client's retries (rewards/remote.py) is a failed call (`ok` False: the episode is masked
out of the loss and counted), never an answer. `step_many` makes the calls of the rows whose turns
ended together on the client's pool, `concurrency` at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlkube.runtime.contract.sections.environment_spec import EnvironmentClientSpec
from rlkube.runtime.rewards.remote import CallFailed, EnvironmentClient, connect_environment
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

    def take_stats(self) -> dict:
        """What the calls cost since the last take (rewards/remote.py EnvironmentStats.take): the
        trainer takes them once a rollout (toolCallRetries), which also keeps them bounded."""
        return self.client.stats.take()

    def step_many(self, calls: Sequence[tuple[str, ToolCall]]) -> list[ToolResult]:
        """`step` of each (episode_id, call), at once on the client's pool; results in order."""
        return self.client.map(lambda pair: self.step(*pair), calls)


def connect_environment_tools(settings: EnvironmentClientSpec | None = None) -> EnvironmentTools:
    """The executor of `rollout.tools.remote`: the job's environment (RLKUBE_ENVIRONMENT_URL) called
    with `settings` (roles.environment.client), once it answers /healthz (its replicas start beside
    the trainers)."""
    return EnvironmentTools(connect_environment(settings, field="rollout.tools.remote"))
