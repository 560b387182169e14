"""GRPO with a reward-model role (a sequence classifier) instead of a rule-based function."""

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.trainers.rl import train

from .rl_common import TINY_MODEL, rl_config

pytestmark = pytest.mark.slow


def test_grpo_with_a_reward_model_runs_and_scores_every_completion(tmp_path):
    torch.set_num_threads(1)
    reward_model = {"config": {**TINY_MODEL, "hidden_size": 32, "intermediate_size": 64}, "dtype": "float32",
                    "attention": "sdpa"}
    cfg = RuntimeConfig.model_validate(rl_config(
        tmp_path, "grpo",
        roles={"actor": {"gpus": 1}, "reward": {"gpus": 0, "model": reward_model}},
        batching={"globalBatch": 4, "maxMicroBatch": 16},
        training={"steps": 2, "groupSize": 4},
        rollout={"maxNewTokens": 8},
    ))
    result = train(cfg)
    assert result.steps_run == 2
    for rec in result.records:
        # a random classifier gives distinct scores, so every group carries signal
        assert rec["rewardStd"] > 0 and rec["groupsWithSignal"] == 1.0
