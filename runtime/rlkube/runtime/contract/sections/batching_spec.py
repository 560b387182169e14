"""`batching`: the samples of an optimizer step and their micro-batches, with its own rule (the
micro-batch bounds).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import Spec

MICRO_BATCH_BOUNDS = (
    Rule("maxMicroBatch: must be >= minMicroBatch", "self.maxMicroBatch >= self.minMicroBatch",
         lambda b: when(b.max_micro_batch < b.min_micro_batch, f" ({b.min_micro_batch}), got {b.max_micro_batch}"),
         ".maxMicroBatch"),
)


class BatchingSpec(Spec):
    """How many samples make an optimizer step and how they are split into micro-batches.

    Every field applies to every algorithm. On a GPU the runtime plans its memory before the
    first step (weights, gradients, optimizer state, KV cache, a reserve) and sizes training
    micro-batches, forward-only passes and decode rows from what is left of memoryFraction of
    the card; an out-of-memory error halves the budget and redoes the work."""

    RULES = MICRO_BATCH_BOUNDS

    global_batch: int = Field(
        default=32, ge=1, le=1_048_576,
        description="Samples (pairs for DPO, prompts for PPO/GRPO) per optimizer step across all "
        "workers. Kept fixed when workers or micro-batches change.",
    )
    mode: Literal["fixed", "adaptive"] = Field(
        default="adaptive",
        description="'adaptive': micro-batches cut by a token budget (from the memory plan on a GPU, "
        "maxTokensPerGpu on a CPU) that follows each step's measured peak memory. 'fixed': "
        "micro-batches of maxMicroBatch samples (DPO) or rollout rows (PPO/GRPO), whatever they cost. "
        "In both, an out-of-memory error shrinks the micro-batch and redoes the work.",
    )
    min_micro_batch: int = Field(
        default=1, ge=1, le=65536,
        description="Smallest micro-batch (samples for DPO, rollout rows for PPO/GRPO) the adaptive "
        "batcher plans, whatever the token budget.",
    )
    max_micro_batch: int = Field(
        default=64, ge=1, le=65536,
        description="Largest micro-batch, in samples (DPO) or rollout rows (PPO/GRPO: prompts x "
        "groupSize), whatever the token budget.",
    )
    max_tokens_per_gpu: int | None = Field(
        default=None, ge=64, le=16_777_216,
        description="Token budget of one training micro-batch on one GPU (packed tokens, or rows x "
        "longest row when padded; PPO/GRPO rows are padded). Unset: the memory plan's on a GPU, 16384 "
        "on a CPU. Set: the plan's budget is capped at this value (DPO's adaptive batcher may grow "
        "past it when measured memory allows, as before).",
    )
    memory_fraction: float = Field(
        default=0.9, ge=0.3, le=0.98,
        description="Share of the GPU's memory the memory plan and the adaptive batcher may fill "
        "(peak reserved memory, CUDA context included). The rest is headroom.",
    )

