"""PPO/GRPO evaluation: the mean reward of greedy completions of the eval prompts.

Greedy (temperature 0), one completion a prompt, whatever the rollout's sampling: the number then
says what the policy does, not what a sample of it happened to do, and two evaluations of the
same weights agree. The eval prompts go through the rollout's own path in blocks of the step's
row count (globalBatch x groupSize, which every role's ranks split evenly): the actor's ranks
generate with the hybrid engine, the reward role scores (rule or model), every rank gets the
scores. The last block is filled up with repeats of its first prompt, whose rewards are not
counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.prompts import PromptData
from rlkube.runtime.engine.hybrid_engine import HybridEngine
from rlkube.runtime.engine.sampling import SamplingParams
from rlkube.runtime.trainers.rl.groups import RoleGroups
from rlkube.runtime.trainers.rl.multi_turn import MultiTurnEpisodes
from rlkube.runtime.trainers.rl.rollout import RolloutWorker, fixed_prompt_width
from rlkube.runtime.trainers.rl.scoring import Scorer


class GreedyEvaluator:
    """Mean reward of greedy completions of `data`'s prompts, the same on every rank."""

    def __init__(self, config: RuntimeConfig, groups: RoleGroups, data: PromptData, scorer: Scorer,
                 engine: HybridEngine | None, eos_id: int, pad_id: int, block_rows: int,
                 sync: Callable[[], None], episodes: MultiTurnEpisodes | None = None) -> None:
        """`episodes`: multi-turn episodes (rollout.maxTurns > 1), evaluated as the rollouts play them."""
        greedy = SamplingParams(max_new_tokens=config.rollout.max_new_tokens, temperature=0.0,
                                eos_token_id=eos_id, pad_token_id=pad_id)
        self.worker = RolloutWorker(config, groups, data, None, greedy, pad_id, 1, engine, sync,
                                    fixed_prompt_width(config, data, groups.ctx.device), episodes, "e")
        self.data, self.scorer, self.block_rows = data, scorer, block_rows
        self.blocks = 0  # blocks generated in the run's evaluations: multi-turn episode ids 'e<block>-<row>'

    def __call__(self) -> dict:
        n, total, length, scored = len(self.data), 0.0, 0.0, 0
        for start in range(0, n, self.block_rows):
            index = list(range(start, min(start + self.block_rows, n)))
            real = len(index)
            index += [index[0]] * (self.block_rows - real)
            # greedy: the step seeds nothing, and numbers the block for multi-turn episode ids
            rollout, _ = self.worker.generate(self.blocks, self.worker.prompt_batch(index))
            self.blocks += 1
            scores = self.scorer.rewards(rollout, self.data)
            kept = scores[:real][torch.isfinite(scores[:real])]  # NaN: the environment failed to score it
            total, scored = total + float(kept.sum()), scored + kept.numel()
            length += float(rollout.response_mask[:real].sum())
        return {"samples": n, "rewardMean": total / scored if scored else None, "responseLengthMean": length / n}
