"""Evaluation on a held-out or separate eval set moves the right way on the toy tasks (fixed seed):
DPO's implicit-reward accuracy and margin on held-out pairs rise, GRPO's mean reward of greedy
completions of held-out prompts rises, and an eval file in another format (conversational JSONL
next to synthetic training pairs) is scored too. What /progress and /metrics make of an
evaluation is checked on the last record. A few seconds each on one CPU thread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prometheus_client import generate_latest

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.progress import Progress
from rlkube.runtime.trainers.base import train_on_this_rank
from rlkube.runtime.trainers.dpo import DPOTrainer

from .conftest import tiny_config
from .rl_common import rl_config

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "examples" / "data" / "chat-preferences.jsonl"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def run_dpo(cfg: RuntimeConfig) -> tuple[DPOTrainer, object]:
    held: dict = {}

    def make(config, ctx):
        held["trainer"] = DPOTrainer(config, ctx)
        return held["trainer"]

    result = train_on_this_rank(make, cfg, None)
    return held["trainer"], result


def test_dpo_eval_accuracy_and_margin_rise_on_held_out_pairs(tmp_path):
    cfg = RuntimeConfig.model_validate(tiny_config(
        tmp_path, data={"evalFraction": 0.25}, training={"lr": 2e-4, "evalEverySteps": 1}))
    trainer, result = run_dpo(cfg)

    assert len(trainer.data) == 384 and len(trainer.eval_data) == 128  # 512 synthetic pairs, a quarter held out
    held_out = set(zip(map(tuple, trainer.eval_data.chosen), map(tuple, trainer.eval_data.rejected), strict=True))
    trained = set(zip(map(tuple, trainer.data.chosen), map(tuple, trainer.data.rejected), strict=True))
    assert not held_out & trained

    evals = result.evals
    assert [e["step"] for e in evals] == list(range(1, 13))
    assert all(e["samples"] == 128 for e in evals)
    first, last = evals[0], evals[-1]
    assert last["accuracy"] - first["accuracy"] > 0.15, evals
    assert last["margin"] > 5 * first["margin"] > 0, evals
    assert last["loss"] < first["loss"]

    progress = Progress(cfg.training.steps)
    progress.update(**result.steps[-1].progress_fields())
    shown = progress.snapshot()
    assert shown["evalStep"] == 12 and shown["evalAccuracy"] == last["accuracy"]
    assert shown["evalMargin"] == last["margin"] and shown["evalRewardMean"] == last["rewardMean"]
    metrics = generate_latest(progress.registry).decode()
    assert f"rlkube_eval_accuracy {last['accuracy']}" in metrics and "rlkube_eval_step 12.0" in metrics


def test_dpo_evaluates_a_conversational_eval_file_only_when_due(tmp_path):
    cfg = RuntimeConfig.model_validate(tiny_config(
        tmp_path, data={"eval": str(CHAT), "maxSeqLen": 160},
        batching={"maxTokensPerGpu": 1024}, training={"steps": 4, "evalEverySteps": 3}))
    trainer, result = run_dpo(cfg)
    assert len(trainer.data) == 512  # nothing held out of the training data
    assert [e["step"] for e in result.evals] == [3, 4]  # every 3 steps, and after the last one
    assert all(e["samples"] == 300 for e in result.evals)
    assert all(0.0 <= e["accuracy"] <= 1.0 for e in result.evals)


def test_grpo_eval_reward_of_greedy_completions_rises(tmp_path):
    from rlkube.runtime.trainers.rl import train

    cfg = RuntimeConfig.model_validate(rl_config(
        tmp_path, "grpo", data={"evalFraction": 0.25}, training={"steps": 4, "evalEverySteps": 1}))
    result = train(cfg)
    evals = result.evals
    assert [e["step"] for e in evals] == [1, 2, 3, 4]
    assert all(e["samples"] == 16 for e in evals)  # 64 synthetic prompts, a quarter held out
    assert evals[-1]["rewardMean"] - evals[0]["rewardMean"] > 0.2, evals
