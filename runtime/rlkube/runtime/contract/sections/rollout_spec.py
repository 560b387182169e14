"""`rollout`: how PPO and GRPO generate their completions (sampling, how decode rows are used, and
multi-turn episodes with tools).

Decode rows: by default an actor GPU decodes all its rows of the step at once (one wave: the
fewest decode steps, since no scheme needs fewer than the longest completion). `decodeRows`
streams them through a fixed number of rows instead, which bounds the KV cache (rows x
(prompt + maxNewTokens) slots) and the rows each decode step computes; `refill` says what a
row does when its completion ends (engine/decode_batch.py).

Multi-turn: with `maxTurns` > 1 an episode is several assistant turns; a turn that ends in a tool
call (`<tool_call>{...}</tool_call>`) is answered by the tool executor of `tools`, its output
appended as a tool turn, and the policy goes on (docs/multi-turn.md). The rules tying these
fields to each other and to the algorithm are `contract.multi_turn`'s.
"""

from __future__ import annotations

from pydantic import Field

from rlkube.runtime.contract.spec import MAX_PATH_LEN, Spec


class ToolsSpec(Spec):
    """The tool executor of multi-turn episodes: what answers the policy's tool calls. Exactly one
    of `function` and `remote` is set (contract.multi_turn)."""

    function: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description="Import path 'package.module:function' of an in-process tool function(name: str, "
        "arguments: dict) -> str (the tool's output) or a ToolResult (rlkube.runtime.tools), run in the "
        "actor's processes, e.g. 'rlkube.runtime.tools.calculator:calculator'. An exception it raises "
        "is a failed call: the episode is masked out of the loss and counted, not scored. Exactly one of "
        "function and remote is set.",
    )
    remote: bool | None = Field(
        default=None,
        description="true: the job's environment (roles.environment, POST /v1/step) answers the tool calls, "
        "one step of the episode per call, an episode kept on one replica. A call that still fails after "
        "the client's retries is a failed call: the episode is masked out of the loss and counted, not "
        "scored. Exactly one of function and remote is set.",
    )


class RolloutSpec(Spec):
    """Generation settings for PPO and GRPO rollouts."""

    max_new_tokens: int = Field(
        default=64, ge=1, le=1_048_576,
        description="Longest completion: the most tokens the policy generates in one turn (with maxTurns 1, "
        "the whole completion).",
    )
    temperature: float = Field(
        default=1.0, ge=0.0, le=100.0,
        description="Sampling temperature; 0 is greedy (PPO only: GRPO's completions of one prompt "
        "would all be the same).",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=0, ge=0, le=1_000_000, description="Top-k sampling; 0 turns it off.")
    decode_rows: int | None = Field(
        default=None, ge=1, le=1_048_576,
        description="Decode rows per actor GPU: the step's completions of each actor GPU (globalBatch x "
        "groupSize / roles.actor.gpus) stream through this many rows, which bounds the KV cache and the "
        "work of each decode step. At most the rows each actor GPU generates. Unset: all of them at once.",
    )
    refill: bool = Field(
        default=True,
        description="With decodeRows below the rows an actor GPU generates: a row whose completion ends "
        "(EOS or maxNewTokens) takes the next waiting prompt at once, instead of waiting for the longest "
        "completion of its wave. Results keep the prompts' order, GRPO's groups included. Greedy tokens "
        "are the same either way; sampled completions come from the same distribution, but from other "
        "random draws (a prompt's noise depends on the row and step it lands on), so runs with refill on "
        "and off are each reproducible, not equal to each other. Off: the rows go in waves.",
    )
    max_turns: int = Field(
        default=1, ge=1, le=1024,
        description="Assistant turns per episode (ppo, grpo). 1: one completion per prompt, no tools. Above 1: "
        "a turn that ends in a tool call (<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>) is "
        "answered by rollout.tools, the output is appended as a tool turn, and the policy generates the "
        "next turn, until a turn ends without a call, at EOS or maxNewTokens, or the episode runs out of "
        "turns or tokens. Tool tokens are attended to but never trained on.",
    )
    max_episode_tokens: int | None = Field(
        default=None, ge=1, le=1_048_576,
        description="With maxTurns > 1: the most tokens of an episode's response, every turn's and every tool "
        "output's together (at least maxNewTokens). A tool turn that would not fit ends the episode. "
        "Unset: maxNewTokens.",
    )
    tools: ToolsSpec | None = Field(
        default=None, description="The tool executor answering the policy's tool calls (maxTurns > 1)."
    )

    @property
    def episode_tokens(self) -> int:
        """The most response tokens of a row: an episode's (maxEpisodeTokens), or one turn's."""
        return self.max_episode_tokens if self.max_episode_tokens is not None else self.max_new_tokens

    @property
    def multi_turn(self) -> bool:
        return self.max_turns > 1
