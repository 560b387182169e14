"""DPO losses as pure functions of per-sequence log-probabilities.

Inputs are, for each preference pair, the summed log-probability of the chosen and of the
rejected response under the policy and under the frozen reference (prompt tokens excluded).
The implicit reward of a response is beta * (policy logp - reference logp).

- sigmoid (Rafailov et al., 2023): loss = -log sigmoid(beta * h), with
  h = (pi_c - ref_c) - (pi_r - ref_r).
- ipo (Azar et al., 2023): loss = (h' - 1 / (2 beta))^2, where h' uses log-probabilities
  averaged over each response's tokens (the IPO paper's per-token normalisation), so the
  regression target 1/(2 beta) does not depend on response length.

Both return the loss per pair (not reduced); the trainer decides the normalisation, because with
gradient accumulation over several micro-batches and ranks the right divisor is the global
batch, not the micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PairLogps:
    """Per-pair summed log-probs (shape [pairs]) and response token counts."""

    policy_chosen: torch.Tensor
    policy_rejected: torch.Tensor
    reference_chosen: torch.Tensor
    reference_rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


def sigmoid_loss(logps: PairLogps, beta: float) -> torch.Tensor:
    """Per-pair DPO loss, -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))."""
    h = (logps.policy_chosen - logps.reference_chosen) - (logps.policy_rejected - logps.reference_rejected)
    return -F.logsigmoid(beta * h)


def ipo_loss(logps: PairLogps, beta: float) -> torch.Tensor:
    """Per-pair IPO loss on length-normalised log-ratios."""
    chosen = (logps.policy_chosen - logps.reference_chosen) / logps.chosen_tokens.clamp(min=1)
    rejected = (logps.policy_rejected - logps.reference_rejected) / logps.rejected_tokens.clamp(min=1)
    return (chosen - rejected - 1.0 / (2.0 * beta)) ** 2


def pair_loss(logps: PairLogps, beta: float, loss_type: str) -> torch.Tensor:
    if loss_type == "sigmoid":
        return sigmoid_loss(logps, beta)
    if loss_type == "ipo":
        return ipo_loss(logps, beta)
    raise ValueError(f"training.lossType: must be 'sigmoid' or 'ipo', got {loss_type!r}")


@dataclass(frozen=True)
class PairStats:
    """Sums over a set of pairs (so they add up across micro-batches and ranks). The sums are
    detached 0-dim tensors on the losses' device: a float() per micro-batch would make the host
    wait for its forward before launching the backward; the trainer reads a step's worth at once."""

    pairs: int
    loss_sum: torch.Tensor
    margin_sum: torch.Tensor  # sum of (chosen reward - rejected reward)
    correct: torch.Tensor  # pairs whose chosen reward beats the rejected one
    chosen_reward_sum: torch.Tensor
    rejected_reward_sum: torch.Tensor


def pair_stats(logps: PairLogps, losses: torch.Tensor, beta: float) -> PairStats:
    """Reward margin and preference accuracy of a set of pairs (no gradients)."""
    with torch.no_grad():
        chosen = beta * (logps.policy_chosen - logps.reference_chosen)
        rejected = beta * (logps.policy_rejected - logps.reference_rejected)
        return PairStats(
            pairs=int(losses.numel()),
            loss_sum=losses.detach().sum(),
            margin_sum=(chosen - rejected).sum(),
            correct=(chosen > rejected).sum(),
            chosen_reward_sum=chosen.sum(),
            rejected_reward_sum=rejected.sum(),
        )
