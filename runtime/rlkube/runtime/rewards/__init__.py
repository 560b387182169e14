"""Rewards: rule-based functions named by import path, and a reward-model role.

A rule-based reward is any `function(prompt: str, completion: str) -> float`, named in the
config as 'package.module:function' (`roles.reward.function`) and looked up once at start.
`target_pattern` is the one rlkube ships for its toy task and tests.

A reward model is an `AutoModelForSequenceClassification` with one label, loaded from the
reward role's model spec (or built from a config), that scores each (prompt, completion)
sequence at its last real token. It runs on the reward role's own device group.
"""

from rlkube.runtime.rewards.functions import (
    TARGET_PATTERN,
    RewardFunction,
    load_reward_function,
    score_with_function,
    target_pattern,
)

__all__ = ["TARGET_PATTERN", "RewardFunction", "load_reward_function", "score_with_function", "target_pattern"]
