"""`rollout`: how PPO and GRPO generate their completions (sampling, and how decode rows are used).

Decode rows: by default an actor GPU decodes all its rows of the step at once (one wave: the
fewest decode steps, since no scheme needs fewer than the longest completion). `decodeRows`
streams them through a fixed number of rows instead, which bounds the KV cache (rows x
(prompt + maxNewTokens) slots) and the rows each decode step computes; `refill` says what a
row does when its completion ends (engine/decode_batch.py).
"""

from __future__ import annotations

from pydantic import Field

from rlkube.runtime.contract.spec import Spec


class RolloutSpec(Spec):
    """Generation settings for PPO and GRPO rollouts."""

    max_new_tokens: int = Field(default=64, ge=1, le=1_048_576, description="Longest completion.")
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
