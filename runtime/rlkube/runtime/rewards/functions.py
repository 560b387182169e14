"""Rule-based rewards: any `function(prompt: str, completion: str) -> float`, named in the config
as 'package.module:function' (`roles.reward.function`) and looked up once at start.
`target_pattern` is the one rlkube ships for its toy task and tests.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

import torch

RewardFunction = Callable[[str, str], float]

# The toy task: write lowercase ASCII letters. A random byte-level model hits this class with
# probability ~26/259 per byte, so the reward is dense enough to learn from in a few steps,
# and there is a clear ceiling (1.0) to measure progress against.
TARGET_PATTERN = re.compile(r"[a-z]")


def target_pattern(prompt: str, completion: str) -> float:
    """Fraction of the completion's characters that match `TARGET_PATTERN` (0 for an empty one)."""
    if not completion:
        return 0.0
    return sum(1 for ch in completion if TARGET_PATTERN.fullmatch(ch)) / len(completion)


def load_function(path: str, field: str) -> Callable:
    """The function named by 'package.module:function' (a reward, a tool); ValueError naming
    `field` when it cannot be found."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{field}: cannot import module {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{field}: {module_name!r} has no callable {attr!r}")
    return fn


def load_reward_function(path: str) -> RewardFunction:
    """The reward function named by roles.reward.function ('package.module:function')."""
    return load_function(path, "roles.reward.function")


def score_with_function(fn: RewardFunction, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """[N] float32 rewards; a non-finite value is an error in the user's function, named as such."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        value = float(fn(prompt, completion))
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"roles.reward.function returned {value} for prompt {prompt[:40]!r}")
        scores.append(value)
    return torch.tensor(scores, dtype=torch.float32)
