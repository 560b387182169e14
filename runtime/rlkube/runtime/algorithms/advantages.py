"""Advantage estimation for PPO (GAE) and GRPO (group-normalised rewards).

Pure functions of tensors. Token sequences are `[batch, time]` with a `mask` of the same shape
that is 1 on response tokens (the tokens the policy chose) and 0 on prompt and padding. The
masked positions after a row's last valid token end the episode: GAE never bootstraps across
them, so a response that stopped early at EOS gets no value from the padding behind it. Masked
positions between valid ones (a tool's output inside a multi-turn episode) are skipped: the next
valid token of the row is the next step.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1 (all of them when dim is None)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Population variance of `x` over the masked positions."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise `x` to unit variance over the masked positions (and zero mean if shift_mean).

    Masked-out positions come back as 0, so they can never leak into a loss.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over masked token sequences.

    rewards, values, mask: `[batch, time]`. For each valid token t (mask 1), with t+1 the
    row's next valid token and `m_{t+1}` 0 past the row's last one:

        delta_t = r_t + gamma * m_{t+1} * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * m_{t+1} * A_{t+1}

    Returns (advantages, returns) with returns = A + V, both zero where mask is 0. A row whose
    valid tokens have gaps (multi-turn: tool tokens between the policy's turns) is computed over
    its valid tokens moved flush left and put back; a row without gaps is left as it is.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape:
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    valid = mask.bool()
    gaps = (valid[:, 1:] & ~valid[:, :-1]).any() if valid.shape[1] > 1 else torch.tensor(False)
    if bool(gaps) and bool(valid.any()):
        # stable sort: each row's valid positions first, in order; the rest after
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        packed = [t.gather(1, order) for t in (rewards, values, mask)]
        adv_packed, ret_packed = gae(*packed, gamma=gamma, lam=lam)
        back = torch.argsort(order, dim=1)
        return adv_packed.gather(1, back), ret_packed.gather(1, back)
    m = mask.to(values.dtype)
    rewards = rewards * m
    values = values * m
    steps = rewards.shape[1]
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    next_mask = torch.zeros_like(values[:, 0])
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_mask * next_value - values[:, t]
        advantage = (delta + gamma * lam * next_mask * next_advantage) * m[:, t]
        advantages[:, t] = advantage
        next_value, next_advantage, next_mask = values[:, t], advantage, m[:, t]
    returns = (advantages + values) * m
    return advantages, returns


def group_normalized_advantages(
    rewards: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = 1e-6,
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO advantages: each completion's reward relative to the others sampled for its prompt.

    `rewards` is `[num_prompts * group_size]` in group layout (the completions of one prompt are
    consecutive, see `grpo.group_layout`). A_i = (r_i - mean_g) / (std_g + eps), with std the
    unbiased sample standard deviation of the group (as in DeepSeekMath's GRPO). With
    scale_by_std False only the mean is subtracted (Dr. GRPO), which avoids up-weighting groups
    whose rewards barely differ.

    `valid` ([num_prompts * group_size] bool): the completions that count. One that does not (a
    multi-turn episode whose tool call failed: it is masked out of the loss) gets advantage 0 and
    takes no part in its group's mean and std; a group with fewer than two that count gets 0.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"group_normalized_advantages: rewards of shape {tuple(rewards.shape)} is not a flat "
            f"multiple of groupSize={group_size}"
        )
    if valid is not None and not bool(valid.all()):
        return _valid_group_advantages(rewards, valid, group_size, scale_by_std, eps)
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_by_std and group_size > 1:
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    return centered.reshape(-1)


def _valid_group_advantages(rewards: torch.Tensor, valid: torch.Tensor, group_size: int, scale_by_std: bool,
                            eps: float) -> torch.Tensor:
    """group_normalized_advantages over the `valid` completions of each group only."""
    grouped = rewards.float().view(-1, group_size)
    counts = valid.view(-1, group_size).float()
    n = counts.sum(dim=1, keepdim=True)
    mean = (grouped * counts).sum(dim=1, keepdim=True) / n.clamp_min(1.0)
    centered = (grouped - mean) * counts
    if scale_by_std and group_size > 1:
        std = ((centered ** 2).sum(dim=1, keepdim=True) / (n - 1).clamp_min(1.0)).sqrt()
        centered = centered / (std + eps)
    return (centered * (n >= 2).float()).reshape(-1)
