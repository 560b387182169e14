"""Builders for tiny CPU PPO/GRPO runs on the toy task (write lowercase letters)."""

from __future__ import annotations

from pathlib import Path

from tests.sections import with_sections

TINY_MODEL = {
    "model_type": "qwen2", "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 128, "tie_word_embeddings": False,
}
TARGET = "rlkube.runtime.rewards:target_pattern"


def rl_config(tmp: Path, algorithm: str, **sections) -> dict:
    """A camelCase RuntimeConfig for `algorithm` with a rule-based reward; sections override."""
    roles = {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": TARGET}}
    if algorithm == "ppo":
        roles["critic"] = {"colocateWith": "actor"}
    cfg = {
        "algorithm": algorithm,
        "model": {"config": dict(TINY_MODEL), "dtype": "float32", "attention": "sdpa"},
        "roles": roles,
        "data": {"source": "toy", "format": "synthetic", "numSamples": 64, "maxSeqLen": 64},
        "batching": {"globalBatch": 8 if algorithm == "grpo" else 32, "maxMicroBatch": 64, "mode": "fixed"},
        "training": {"steps": 20, "lr": 3e-3, "groupSize": 8, "seed": 0},
        "rollout": {"maxNewTokens": 16, "temperature": 1.0},
        "checkpoint": {"dir": str(tmp / "ckpt"), "everySteps": 1000},
        "progressPort": 0,
        "outputDir": str(tmp / "out"),
    }
    return with_sections(cfg, sections)
