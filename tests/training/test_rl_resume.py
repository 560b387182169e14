"""Resume mid-run: a PPO run stopped after step 2 and restarted computes steps 3-4 exactly as an
uninterrupted run does (actor, critic and both optimizers come from the checkpoint; prompts and
sampling are functions of (seed, step))."""

import pytest
import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.checkpoint import committed
from rlkube.runtime.trainers.rl import train

from .rl_common import rl_config

pytestmark = pytest.mark.slow


def config(tmp, steps):
    return RuntimeConfig.model_validate(rl_config(
        tmp, "ppo",
        roles={"actor": {"gpus": 1}, "critic": {"colocateWith": "actor"},
               "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"},
               "reference": {"colocateWith": "actor"}},
        batching={"globalBatch": 16, "maxMicroBatch": 8},
        training={"steps": steps, "lr": 3e-3, "seed": 3, "ppoEpochs": 2, "miniBatches": 2, "kl": 0.05},
        rollout={"maxNewTokens": 8},
        checkpoint={"dir": str(tmp / "ckpt"), "everySteps": 2, "keep": 2},
    ))


def test_resume_from_mid_run_checkpoint_repeats_the_uninterrupted_steps(tmp_path):
    torch.set_num_threads(1)
    whole = train(config(tmp_path / "whole", 4))
    assert whole.steps_run == 4

    first = train(config(tmp_path / "split", 2))
    assert [s for s, _ in committed(tmp_path / "split" / "ckpt")] == [2]
    second = train(config(tmp_path / "split", 4))
    assert second.first_step == 3 and second.steps_run == 2
    assert first.series("rewardMean") == pytest.approx(whole.series("rewardMean")[:2], rel=1e-6)
    assert second.series("rewardMean") == pytest.approx(whole.series("rewardMean")[2:], rel=1e-6)
    assert second.losses == pytest.approx(whole.losses[2:], rel=1e-5, abs=1e-7)
    critic_losses = [r["value_loss"] for r in second.records]
    assert critic_losses == pytest.approx([r["value_loss"] for r in whole.records[2:]], rel=1e-5, abs=1e-7)


def test_a_resumed_run_takes_its_trained_weights_from_the_checkpoint_not_from_model_path(tmp_path):
    """A restart does not read model.path's weight files for the roles it trains (actor and
    critic): every parameter comes from the checkpoint. With those files gone after the first half,
    the second half still starts, and its steps are the uninterrupted run's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .rl_common import TINY_MODEL

    torch.set_num_threads(1)
    fields = dict(TINY_MODEL)
    torch.manual_seed(0)
    model_dir = tmp_path / "model"
    AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)).save_pretrained(model_dir)

    def path_config(tmp, steps):
        return RuntimeConfig.model_validate(rl_config(
            tmp, "ppo",
            model={"path": str(model_dir), "config": None, "dtype": "float32", "attention": "sdpa"},
            batching={"globalBatch": 16, "maxMicroBatch": 8},
            training={"steps": steps, "lr": 3e-3, "seed": 3, "kl": 0.0},
            rollout={"maxNewTokens": 8},
            checkpoint={"dir": str(tmp / "ckpt"), "everySteps": 2, "keep": 2},
        ))

    whole = train(path_config(tmp_path / "whole", 4))
    first = train(path_config(tmp_path / "split", 2))
    weights = sorted(model_dir.glob("*.safetensors"))
    assert weights
    for file in weights:
        file.rename(file.with_suffix(".moved"))
    second = train(path_config(tmp_path / "split", 4))
    assert second.first_step == 3 and second.steps_run == 2
    assert first.losses == pytest.approx(whole.losses[:2], rel=1e-5, abs=1e-7)
    assert second.losses == pytest.approx(whole.losses[2:], rel=1e-5, abs=1e-7)
    assert [r["value_loss"] for r in second.records] == pytest.approx(
        [r["value_loss"] for r in whole.records[2:]], rel=1e-5, abs=1e-7)
    # a fresh run (no checkpoint) still needs them: it reads the weights, and fails without them
    with pytest.raises(Exception):  # noqa: B017 (transformers' error type for a missing file varies)
        train(path_config(tmp_path / "fresh", 1))
