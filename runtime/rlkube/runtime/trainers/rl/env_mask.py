"""Completions the environment failed to score (`roles.reward.remote`): left out of the step, never
scored as 0, and counted.

The scorer reports such a completion's reward as NaN (rewards/remote.py: a call that failed after
its retries), and the scores reach every rank through the reward role's broadcast, so every rank
masks the same rows here:
- `scored["valid"]` says which rows have a reward; `loss_mask` is the response mask with the other
  rows' tokens zeroed. The estimators take it (GRPO leaves those rows out of their group's mean and
  standard deviation and gives them advantage 0, registry.group_advantages; PPO's GAE and
  whitening skip them), and the trained roles weigh their tokens by it (`row_weight` in the
  actor's and the critic's losses, and in update.py's micro-batch and mini-batch weights): their
  loss weight is 0, and the loss is the aggregate over the rows that have a reward;
- their tokens still go through the forward: every rank's micro-batches keep the shapes they have,
  so FSDP's collectives match on every rank (a micro-batch whose rows had no response token would
  skip the head on one rank only);
- their placeholder score is 0 in `scored["scores"]` (a number the estimators may read, on rows
  the loss mask zeroes), while the step record's reward statistics are taken over the valid rows.
"""

from __future__ import annotations

import torch

from rlkube.runtime.infra.distributed import DistContext, all_reduce_max, all_reduce_sum
from rlkube.runtime.rewards.remote import EnvironmentClient
from rlkube.runtime.trainers.rl.rollout import Rollout


def mask_failed_rows(scored: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mark the rows whose score is not finite, as the module says; returns the step's scores with
    NaN where a row failed (for the record)."""
    scores = scored["scores"]
    failed = ~torch.isfinite(scores)
    if failed.any():
        scored["valid"] = ~failed
        scored["scores"] = torch.where(failed, torch.zeros_like(scores), scores)
    return torch.where(failed, torch.full_like(scores, float("nan")), scores)


def loss_mask(rollout: Rollout, scored: dict[str, torch.Tensor]) -> torch.Tensor:
    """[N, T] float: the response mask, zero on the rows without a reward."""
    mask = rollout.response_mask.float()
    return mask * scored["valid"].float()[:, None] if "valid" in scored else mask


def row_weight(scored: dict[str, torch.Tensor], rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[len(rows), 1] weights of `rows` in a loss (1, or 0 for a row without a reward), on `like`'s
    device and dtype, to multiply a [rows, T] mask with."""
    if "valid" not in scored:
        return torch.ones((len(rows), 1), dtype=like.dtype, device=like.device)
    return scored["valid"][rows].to(device=like.device, dtype=like.dtype)[:, None]


def reward_fields(scores: torch.Tensor, mask: torch.Tensor, group_size: int) -> dict[str, float | None]:
    """rewardMean, rewardStd (and groupsWithSignal for groups of 2 or more) over the rows that have a
    reward and a token in `mask` (`loss_mask`: multi-turn episodes masked out count in neither); a
    group counts as having signal when those of its completions differ."""
    valid = torch.isfinite(scores) & mask.bool().any(dim=1)
    kept = scores[valid]
    out: dict[str, float | None] = {
        "rewardMean": float(kept.mean()) if kept.numel() else None,
        "rewardStd": float(kept.std()) if kept.numel() > 1 else 0.0,
    }
    if group_size > 1:
        grouped, ok = scores.view(-1, group_size), valid.view(-1, group_size)
        top = torch.where(ok, grouped, torch.full_like(grouped, float("-inf"))).max(dim=1).values
        bottom = torch.where(ok, grouped, torch.full_like(grouped, float("inf"))).min(dim=1).values
        out["groupsWithSignal"] = float((top > bottom).float().mean())
    return out


def environment_fields(ctx: DistContext, client: EnvironmentClient | None) -> dict[str, float | int | None]:
    """The step's calls to the environment, over every rank that made some (all ranks take part):
    envFailures (completions left without a reward), envRetries, envCallsPerSecond (summed over
    ranks) and envLatencyP50 / envLatencyP99 (seconds per call; the slowest rank's)."""
    taken = client.stats.take() if client is not None else {}
    failures, retries, calls, rate = all_reduce_sum(ctx, [float(taken.get(key) or 0) for key in (
        "envFailures", "envRetries", "envCalls", "envCallsPerSecond")])
    p50, p99 = all_reduce_max(ctx, [float(taken.get(key) or 0.0) for key in ("envLatencyP50", "envLatencyP99")])
    return {"envFailures": int(failures), "envRetries": int(retries), "envCalls": int(calls),
            "envCallsPerSecond": rate, "envLatencyP50": p50 if calls else None,
            "envLatencyP99": p99 if calls else None}


def remote_fields(ctx: DistContext, client: EnvironmentClient | None, scores: torch.Tensor, mask: torch.Tensor,
                  group_size: int) -> dict[str, float | int | None]:
    """What a step scored through the environment adds to its record: `environment_fields`, and
    `reward_fields` in place of the statistics over every row."""
    return {**reward_fields(scores, mask, group_size), **environment_fields(ctx, client)}
