"""GRPO with a reward-model role (a sequence classifier) instead of a rule-based function."""

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.trainers.rl import train

from .rl_common import TINY_MODEL, rl_config

pytestmark = pytest.mark.slow


def grpo_with_a_reward_model(tmp_path, steps: int, **batching) -> RuntimeConfig:
    """GRPO on the toy task, scored by a tiny random sequence classifier on no GPU of its own."""
    torch.set_num_threads(1)
    reward_model = {"config": {**TINY_MODEL, "hidden_size": 32, "intermediate_size": 64}, "dtype": "float32",
                    "attention": "sdpa"}
    return RuntimeConfig.model_validate(rl_config(
        tmp_path, "grpo",
        roles={"actor": {"gpus": 1}, "reward": {"gpus": 0, "model": reward_model}},
        batching={"globalBatch": 4, "maxMicroBatch": 16, **batching},
        training={"steps": steps, "groupSize": 4},
        rollout={"maxNewTokens": 8},
    ))


def test_grpo_with_a_reward_model_runs_and_scores_every_completion(tmp_path):
    result = train(grpo_with_a_reward_model(tmp_path, steps=2))
    assert result.steps_run == 2
    for rec in result.records:
        # a random classifier gives distinct scores, so every group carries signal
        assert rec["rewardStd"] > 0 and rec["groupsWithSignal"] == 1.0


def test_the_reward_model_scores_by_micro_batches_of_the_forward_budget(tmp_path, monkeypatch):
    """Like every forward-only pass, the reward model's is cut by the forward token budget, and its
    scores come back in row order, as one pass over all rows gives them."""
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.rl.trainer import RLTrainer

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    config = grpo_with_a_reward_model(tmp_path, steps=1, mode="adaptive", maxTokensPerGpu=96)
    trainer = RLTrainer(config, init_from_env(config.device_map))
    try:
        rollout, _ = trainer.rollout.generate(0, trainer.prompts(0))
        model, calls = trainer.scorer.reward_model, []

        def recording(seq, att):
            calls.append(seq.shape)
            return model(seq, att)

        trainer.scorer.reward_model = recording
        scores = trainer.scorer.rewards(rollout, trainer.data)
        whole = model(rollout.sequences, rollout.attention_mask)
        budget = trainer.budgets.forward_tokens
        assert len(calls) > 1 and all(rows * width <= max(budget, width) for rows, width in calls), (calls, budget)
        torch.testing.assert_close(scores, whole.float(), rtol=1e-5, atol=1e-6)
    finally:
        trainer.checkpointer.close()
        trainer.close()
