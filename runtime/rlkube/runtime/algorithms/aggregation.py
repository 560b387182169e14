"""How a per-token loss `[batch, time]` becomes one number: the loss aggregation modes.

With `L_it` the loss of token t of sequence i, `m_it` its response mask, `T_i = sum_t m_it` the
sequence's length and N the number of sequences:

  token-mean           sum_i sum_t m_it L_it / sum_i T_i        every token weighs the same
  seq-mean-token-sum   (1/N) sum_i sum_t m_it L_it              every sequence weighs the same,
                                                                its tokens summed
  seq-mean-token-mean  (1/N) sum_i (sum_t m_it L_it / T_i)      every sequence weighs the same,
                                                                its tokens averaged

(verl's `loss_agg_mode` of the same names; TRL's "bnpo" / "dapo" losses are token-mean, its
"grpo" loss is seq-mean-token-mean.) token-mean keeps a long response from being down-weighted
per token; seq-mean-token-mean is the DeepSeekMath GRPO objective.

The trainer splits a mini-batch into micro-batches and ranks. The mean over the whole mini-batch
is the weighted mean of the micro-batches' aggregates with weights `weight(mask)`: their token
counts for token-mean, their sequence counts for the seq-mean modes. `update.py` scales each
micro-batch's loss by its weight over the mini-batch's, so the gradient is the same whatever the
split (tests/unit/runtime/test_micro_batch_equivalence.py, tests/training/test_gradient_equivalence.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlkube.runtime.algorithms.advantages import masked_mean


def token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every valid token of the batch."""
    return masked_mean(x, mask)


def seq_mean_token_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of each sequence's sum over its valid tokens."""
    return (x * mask.to(x.dtype)).sum(dim=-1).mean()


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of each sequence's mean over its valid tokens (0 for an empty one)."""
    return masked_mean(x, mask, dim=-1).mean()


@dataclass(frozen=True)
class LossAggregation:
    """One aggregation mode: the reduction and what a micro-batch weighs among others."""

    name: str
    reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    per_sequence: bool  # micro-batches weigh their sequences (True) or their tokens (False)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.reduce(x, mask)

    def weight(self, mask: torch.Tensor) -> float:
        """What the rows of `mask` ([rows, time]) weigh in a mean over several micro-batches."""
        return float(mask.shape[0]) if self.per_sequence else float(mask.float().sum())


TOKEN_MEAN = LossAggregation("token-mean", token_mean, per_sequence=False)
SEQ_MEAN_TOKEN_SUM = LossAggregation("seq-mean-token-sum", seq_mean_token_sum, per_sequence=True)
SEQ_MEAN_TOKEN_MEAN = LossAggregation("seq-mean-token-mean", seq_mean_token_mean, per_sequence=True)
