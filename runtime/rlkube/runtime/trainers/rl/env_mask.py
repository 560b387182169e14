"""Completions the environment failed to score (`roles.reward.remote`): left out of the step, never
scored as 0, and counted.

The scorer reports such a completion's reward as NaN (rewards/remote.py: a call that failed after
its retries), and the scores reach every rank through the reward role's broadcast, so every rank
masks the same rows here:
- its response mask is zeroed on the rollout, so none of its tokens enters any loss (the actor's,
  the critic's), PPO's whitening or the token counts: its loss weight is 0;
- `scored["valid"]` says which rows have a reward, and GRPO's estimator leaves the others out of
  their group's mean and standard deviation (registry.group_advantages), giving them advantage 0;
- its placeholder score is 0 in `scored["scores"]` (a number the estimators may read, on a row
  whose mask is 0), while the step record's reward statistics are taken over the valid rows.

With the seq-mean loss aggregations a masked row still counts as a row in the mini-batch's
denominator, as a completion with no tokens does.
"""

from __future__ import annotations

import torch

from rlkube.runtime.infra.distributed import DistContext, all_reduce_max, all_reduce_sum
from rlkube.runtime.rewards.remote import EnvironmentClient
from rlkube.runtime.trainers.rl.rollout import Rollout


def mask_failed_rows(rollout: Rollout, scored: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mask the rows whose score is not finite, as the module says; returns the step's scores with
    NaN where a row was masked (for the record)."""
    scores = scored["scores"]
    failed = ~torch.isfinite(scores)
    if failed.any():
        scored["valid"] = ~failed
        scored["scores"] = torch.where(failed, torch.zeros_like(scores), scores)
        rollout.attention_mask[failed, rollout.prompt_len :] = 0
    return torch.where(failed, torch.full_like(scores, float("nan")), scores)


def reward_fields(scores: torch.Tensor, group_size: int | None) -> dict[str, float | None]:
    """rewardMean, rewardStd (and groupsWithSignal for grouped algorithms) over the rows with a
    reward; a group counts as having signal when its valid completions' rewards differ."""
    valid = torch.isfinite(scores)
    kept = scores[valid]
    out: dict[str, float | None] = {
        "rewardMean": float(kept.mean()) if kept.numel() else None,
        "rewardStd": float(kept.std()) if kept.numel() > 1 else 0.0,
    }
    if group_size:
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
