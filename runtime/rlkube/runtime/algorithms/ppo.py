"""PPO's losses: clipped policy loss, clipped value loss, KL to the reference, entropy bonus.

Pure functions of tensors shaped `[batch, time]` with a response `mask` (1 on tokens the policy
chose). The actor's token-level terms are reduced by a loss aggregation (`aggregation.py`,
training.lossAggregation), token-mean by default: a long response weighs as many tokens as it
has, and padding never enters a mean. The value loss is always token-mean.

Diagnostics (clip fraction, approximate KL, the loss terms) are returned as detached 0-dim
tensors on the loss's device, never as Python floats: a float() waits for the GPU, and one per
micro-batch kept the device idle while the host launched each next stage. The trainer turns a
mini-batch's worth into floats in one transfer (trainers/rl/update.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlkube.runtime.algorithms.advantages import masked_mean
from rlkube.runtime.algorithms.aggregation import TOKEN_MEAN

# (per-token values [B, T], mask [B, T]) -> scalar; an aggregation.LossAggregation
Aggregate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# exp() of a log-ratio beyond this overflows float32 long before it means anything; the k3
# estimator clamps there so one wild token cannot turn the KL into inf.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy-loss evaluation (detached 0-dim tensors)."""

    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio_mean: torch.Tensor


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float | None = None,
    aggregate: Aggregate = TOKEN_MEAN,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """Clipped surrogate loss, reduced by `aggregate` (token-mean by default).

    ratio = exp(logprobs - old_logprobs);
    loss_t = max(-A_t * ratio_t, -A_t * clamp(ratio_t, 1 - clip_low, 1 + clip_high)).
    `clip_high` defaults to `clip_low`; a larger one is DAPO's clip-higher, which lets unlikely
    tokens with positive advantage grow faster and keeps entropy from collapsing.
    `advantages` is `[batch, time]` or `[batch]` (one per sequence, broadcast over its tokens).
    """
    clip_high = clip_low if clip_high is None else clip_high
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_fraction=masked_mean((clipped > unclipped).float(), mask),
            approx_kl=masked_mean(-log_ratio, mask),
            ratio_mean=masked_mean(ratio, mask),
        )
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss, token-mean: 0.5 * max((V - R)^2, (V_clipped - R)^2).

    V_clipped = old_V + clamp(V - old_V, -clip, clip): the critic may move at most `clip` away
    from the values it gave at rollout time before the loss stops rewarding the move.
    Returns (loss, fraction of tokens where the clipped term was the larger).
    """
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_error > unclipped_error).float(), mask)
    return loss, clip_fraction


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_divergence(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the log-probs of tokens sampled from pi.

    With x ~ pi (the policy that sampled the rollout) and r = pi_ref(x) / pi(x), so
    log r = ref_logprobs - logprobs (Schulman, "Approximating KL divergence", 2020):

      k1 = -log r                 E_pi[k1] = KL(pi || pi_ref) (unbiased); negative on some tokens.
      k2 = (log r)^2 / 2          biased (second order in log r), always >= 0, low variance.
      k3 = (r - 1) - log r        E_pi[k3] = KL(pi || pi_ref) (unbiased), always >= 0, low variance.

    As *values* (the KL in the reward, a metric) all three estimate KL(pi || pi_ref). As *loss
    terms* differentiated through pi's log-probs on its own samples, their expected gradients
    differ, since the sampling distribution is not differentiated:

      k1: E_pi[grad log pi] = 0                  no gradient in expectation (refused as a loss).
      k2: E_pi[-log r * grad log pi]             = grad KL(pi || pi_ref), the reverse KL.
      k3: E_pi[(1 - r) grad log pi]              = -E_pi_ref[grad log pi] = grad KL(pi_ref || pi),
                                                   the forward KL (verl's "low_var_kl", TRL's GRPO
                                                   KL term); both KLs are 0 at pi = pi_ref.
    """
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        log_ratio = torch.clamp(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"training.klEstimator: must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")


def kl_loss(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, estimator: str,
    aggregate: Aggregate = TOKEN_MEAN,
) -> torch.Tensor:
    """KL to the reference as a differentiable loss term, reduced by `aggregate`.

    k1 is refused: its expected gradient on the policy's own samples is 0 (see kl_divergence),
    so it would log a KL while never pulling the policy towards the reference.
    """
    if estimator == "k1":
        raise ValueError(
            "training.klEstimator: k1 as a loss term has zero expected gradient on-policy; use k2 "
            "(gradient of KL(pi || pi_ref)) or k3 (gradient of KL(pi_ref || pi)), or put the KL in the reward"
        )
    return aggregate(kl_divergence(logprobs, ref_logprobs, estimator), mask)


@torch.no_grad()
def shaped_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    kl_coef: float,
    estimator: str,
) -> torch.Tensor:
    """Per-token rewards for GAE: the sequence score on its last valid token, minus kl_coef * KL
    on every valid token when the KL goes into the reward (InstructGPT-style PPO).

    scores: `[batch]`; logprobs/ref_logprobs/mask: `[batch, time]`.
    """
    m = mask.to(logprobs.dtype)
    rewards = torch.zeros_like(logprobs)
    if ref_logprobs is not None and kl_coef:
        rewards = rewards - kl_coef * kl_divergence(logprobs, ref_logprobs, estimator) * m
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
    has_tokens = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_tokens]
    rewards[rows, last[has_tokens]] += scores[has_tokens].to(rewards.dtype)
    return rewards


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position: logsumexp(z) - sum(p * z)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def actor_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float | None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    aggregate: Aggregate = TOKEN_MEAN,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor's whole objective: policy loss + kl_coef * KL loss - entropy_coef * entropy,
    each term reduced by `aggregate` (training.lossAggregation).

    Pass ref_logprobs only when the KL is a loss term (PPO with klInReward false, GRPO); when the
    KL is already in the reward, leave it None. Returns (loss, metrics).
    """
    loss, stats = policy_loss(logprobs, old_logprobs, advantages, mask, clip_low, clip_high, aggregate)
    metrics = {
        "policy_loss": loss.detach(),
        "clip_fraction": stats.clip_fraction,
        "approx_kl": stats.approx_kl,
    }
    if ref_logprobs is not None and kl_coef:
        kl = kl_loss(logprobs, ref_logprobs, mask, kl_estimator, aggregate)
        loss = loss + kl_coef * kl
        metrics["kl"] = kl.detach()
    if entropy is not None:
        mean_entropy = aggregate(entropy, mask)
        metrics["entropy"] = mean_entropy.detach()
        if entropy_coef:
            loss = loss - entropy_coef * mean_entropy
    return loss, metrics
