"""KTO (Ethayarajh et al., 2024) as pure functions of per-sequence log-probabilities.

KTO learns from unpaired completions, each labelled desirable or undesirable. With the implicit
reward r = beta * (pi - ref) (summed response log-probs of the policy and the frozen reference)
and a reference point z0, the loss of a completion is

  desirable:   lambda_D * (1 - sigmoid(beta * ((pi - ref) - z0)))
  undesirable: lambda_U * (1 - sigmoid(beta * (z0 - (pi - ref))))

z0 estimates KL(pi || ref) from *mismatched* pairs: each prompt with the completion of another
sample of the batch, so the estimate is not the reward of the very completions being scored.
As in the paper and TRL, it is the batch mean of (pi - ref) over those pairs, detached (no
gradient flows through the reference point) and clamped at 0 (a KL is never negative). The
trainer averages it over every rank's micro-batch before calling `kto_loss`.

The loss is returned per completion (not reduced), like the DPO losses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def kl_reference_point(policy_kl: torch.Tensor, reference_kl: torch.Tensor) -> tuple[float, int]:
    """Sum of (pi - ref) over the mismatched pairs and their count, to be averaged across ranks."""
    with torch.no_grad():
        return float((policy_kl - reference_kl).sum()), int(policy_kl.numel())


def clamp_reference_point(kl_sum: float, count: int) -> float:
    """z0 = max(mean KL estimate, 0); 0 for an empty batch."""
    return max(kl_sum / count, 0.0) if count else 0.0


def kto_loss(
    policy: torch.Tensor, reference: torch.Tensor, desirable: torch.Tensor, z0: float, beta: float,
    desirable_weight: float, undesirable_weight: float,
) -> torch.Tensor:
    """Per-completion KTO loss. `policy`, `reference`: summed log-probs [n]; `desirable`: bool [n]."""
    logratio = policy - reference
    z = torch.as_tensor(z0, dtype=logratio.dtype, device=logratio.device)
    good = desirable_weight * (1.0 - torch.sigmoid(beta * (logratio - z)))
    bad = undesirable_weight * (1.0 - torch.sigmoid(beta * (z - logratio)))
    return torch.where(desirable, good, bad)


@dataclass(frozen=True)
class KtoStats:
    """Sums over a set of completions (they add up across micro-batches and ranks)."""

    samples: int
    loss_sum: float
    correct: int  # reward on the side of z0 its label says (> z0 desirable, < z0 undesirable)
    desirable: int
    desirable_reward_sum: float
    undesirable_reward_sum: float


def kto_stats(policy: torch.Tensor, reference: torch.Tensor, desirable: torch.Tensor, losses: torch.Tensor,
              z0: float, beta: float) -> KtoStats:
    with torch.no_grad():
        reward = beta * (policy - reference)
        above = reward > beta * z0
        return KtoStats(
            samples=int(losses.numel()),
            loss_sum=float(losses.detach().sum()),
            correct=int((above == desirable).sum()),
            desirable=int(desirable.sum()),
            desirable_reward_sum=float(reward[desirable].sum()),
            undesirable_reward_sum=float(reward[~desirable].sum()),
        )
