"""GRPO: group sampling layout and group-normalised advantages.

GRPO samples `group_size` completions per prompt and uses each completion's reward relative to
its group as the advantage of every one of its tokens; there is no critic. What this module
keeps from the DeepSeekMath recipe: group-normalised advantages, the clipped surrogate, an
optional KL-to-reference loss (k3 by default). What it adds: DAPO's clip-higher (a separate
upper clip), and token-mean aggregation over the whole mini-batch instead of the paper's
per-sequence mean, so long completions are not down-weighted per token. The objective itself is
PPO's `actor_loss` with clip-higher, registered as the "grpo" policy loss in `registry.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from rlkube.runtime.algorithms.advantages import group_normalized_advantages

T = TypeVar("T")


def group_layout(prompts: Sequence[T], group_size: int) -> list[T]:
    """Each prompt repeated `group_size` times, consecutively: [p0, p0, .., p1, p1, ..].

    This is the layout `group_normalized_advantages` and `group_of` assume.
    """
    if group_size < 1:
        raise ValueError(f"training.groupSize: must be >= 1, got {group_size}")
    return [prompt for prompt in prompts for _ in range(group_size)]


def group_of(index: int, group_size: int) -> int:
    """The prompt (group) index of completion `index` in group layout."""
    return index // group_size


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale_by_std: bool = True,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
    """One advantage per completion; groups whose rewards are all equal get 0 (no signal).
    `valid`: the completions that count (group_normalized_advantages)."""
    return group_normalized_advantages(rewards, group_size, scale_by_std=scale_by_std, valid=valid)


def fraction_of_groups_with_signal(rewards: torch.Tensor, group_size: int) -> float:
    """Share of groups whose completions got different rewards (the rest teach nothing)."""
    grouped = rewards.view(-1, group_size)
    return float((grouped.max(1).values > grouped.min(1).values).float().mean())
