"""A 4-process gloo PPO run through the pod entry point: actor on ranks 0-1 (FSDP2, hybrid
engine), critic on rank 2, rule-based reward on rank 3, reference time-shared with the actor.
Rollouts move from the actor leader to the other groups and scores/values come back by
collectives; the run must finish, checkpoint, and show the same rewards on every rank."""

import pytest
import yaml

from rlkube.runtime.infra.checkpoint import committed, read_meta

from .conftest import run_cli
from .rl_common import TARGET, rl_config

pytestmark = pytest.mark.slow


def test_ppo_with_actor_critic_reward_on_different_ranks_completes(tmp_path):
    cfg = rl_config(
        tmp_path, "ppo",
        model={"config": {"model_type": "qwen2", "vocab_size": 259, "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "max_position_embeddings": 64, "tie_word_embeddings": False},
               "dtype": "float32", "attention": "sdpa"},
        roles={"actor": {"gpus": 2}, "critic": {"gpus": 1}, "reward": {"gpus": 1, "function": TARGET},
               "reference": {"colocateWith": "actor"}},
        data={"source": "toy", "format": "synthetic", "numSamples": 32, "maxSeqLen": 48},
        batching={"globalBatch": 8, "maxMicroBatch": 2, "mode": "fixed"},
        training={"steps": 2, "lr": 1e-3, "ppoEpochs": 2, "miniBatches": 2, "kl": 0.05},
        rollout={"maxNewTokens": 8},
        checkpoint={"dir": str(tmp_path / "ckpt"), "everySteps": 1, "keep": 1},
    )
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, recs, err = run_cli(path, timeout=400, LOCAL_WORLD_SIZE="4")
    assert code == 0, err[-4000:]
    start = next(r for r in recs if r.get("event") == "start")
    assert start["deviceMap"] == {"actor": [0, 1], "critic": [2], "reward": [3], "reference": [0, 1]}
    assert start["hybridEngineSharded"] is True
    steps = [r for r in recs if r.get("event") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # the reward came from rank 3; the critic trained on rank 2, its value loss reaches rank 0
        # only through the job-wide metric reduction.
        assert 0.0 <= r["rewardMean"] <= 1.0 and r["loss"] is not None and r["kl"] >= 0.0
        assert r["value_loss"] > 0.0
        assert r["reshardSeconds"] > 0.0
    [(step, ckpt)] = committed(tmp_path / "ckpt")
    assert step == 2 and read_meta(ckpt)["worldSize"] == 4
