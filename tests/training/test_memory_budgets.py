"""RL micro-batches by token budget, an out-of-memory error redone at a smaller budget, and a job
that cannot fit failing at start (exit 3) with the terms named, on the CPU.

The card is stood in for by replacing plan_request.device_memory: the plan is the same
arithmetic it makes on a GPU, from the capacity given here.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from rlkube.runtime import cli
from rlkube.runtime.contract import failure
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.pod import EXIT_CONFIG
from rlkube.runtime.trainers import plan_request
from rlkube.runtime.trainers.base import TrainerHooks
from rlkube.runtime.trainers.memory_plan import GIB
from rlkube.runtime.trainers.rl import train

from .rl_common import rl_config


def grpo(tmp_path, budget: int, steps: int = 3, **batching) -> RuntimeConfig:
    cfg = rl_config(tmp_path, "grpo", training={"steps": steps},
                    batching={"mode": "adaptive", "maxTokensPerGpu": budget, **batching})
    return RuntimeConfig.model_validate(cfg)


def test_out_of_memory_is_redone_with_the_losses_of_a_run_at_the_smaller_budget(tmp_path):
    calls, cuts = [], []

    def oom_once(costs):
        calls.append(len(costs))
        cuts.append([c.index for c in costs])
        if len(calls) == 2:  # the second micro-batch of the first step
            raise torch.OutOfMemoryError("injected")

    hit = train(grpo(tmp_path / "hit", 1024), hooks=TrainerHooks(before_micro_batch=oom_once))
    first = hit.records[0]
    assert first["oomRetries"] == 1 and hit.records[1]["oomRetries"] == 0
    shrunk = first["tokenBudget"]
    assert 64 <= shrunk < 1024
    assert len(cuts) > 3 and max(calls) > 1  # the budget really cut the 64 rows into several micro-batches
    # A run that starts at the budget the failed run shrank to computes the same steps.
    fresh = train(grpo(tmp_path / "fresh", shrunk))
    assert fresh.records[0]["tokenBudget"] == shrunk
    assert [r["oomRetries"] for r in fresh.records] == [0, 0, 0]
    assert fresh.losses == pytest.approx(hit.losses, rel=1e-6, abs=1e-9)
    assert [r["rewardMean"] for r in fresh.records] == [r["rewardMean"] for r in hit.records]


def test_an_out_of_memory_error_on_one_row_still_ends_the_run(tmp_path):
    def always(costs):
        raise torch.OutOfMemoryError("injected")

    with pytest.raises(torch.OutOfMemoryError):
        train(grpo(tmp_path, 64, steps=1, maxMicroBatch=1), hooks=TrainerHooks(before_micro_batch=always))


def test_plan_on_a_stand_in_card_sizes_the_step_and_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_request, "device_memory", lambda device: (2 * GIB, 200 << 20))
    cfg = rl_config(tmp_path, "ppo", training={"steps": 2, "kl": 0.05}, batching={"mode": "adaptive"},
                    roles={"reference": {"colocateWith": "actor"}})
    result = train(RuntimeConfig.model_validate(cfg))
    record = result.records[0]
    assert record["tokenBudget"] > 16384 and record["decodeRows"] == 32  # the tiny models leave the card empty
    assert record["forwardTokenBudget"] > record["tokenBudget"]


def test_a_job_that_cannot_fit_fails_at_start_with_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plan_request, "device_memory", lambda device: (8 * GIB, 500 << 20))
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("RLKUBE_TERMINATION_LOG", str(termination))
    cfg = rl_config(tmp_path, "grpo", training={"steps": 2})
    # A Llama-3.2-3B-like shape: 3.2B parameters, 8 bytes each with AdamW in bf16, > 8 GiB.
    cfg["model"]["config"] = {"model_type": "llama", "vocab_size": 128_256, "hidden_size": 3072,
                              "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
                              "num_key_value_heads": 8}
    cfg["model"]["dtype"] = "bfloat16"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["run", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "model: the job does not fit on one GPU of 8.0 GiB" in err and "model.lora" in err
    assert "Traceback" not in err
    message = json.loads(termination.read_text())[failure.TERMINATION_ERROR_KEY]
    assert message[failure.ERROR_FIELD] == "model" and "actorAdamW" in message[failure.ERROR_MESSAGE], message
    assert not (tmp_path / "ckpt").exists()  # nothing was written: it failed before the first step



def test_a_resumed_dpo_run_keeps_the_budget_it_learned(tmp_path, monkeypatch):
    """The first step's calibration is the job's: a resumed run starts from the checkpoint's budget
    and does not calibrate again from its own first step."""
    from types import SimpleNamespace

    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers import dpo

    from .conftest import tiny_config

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(plan_request, "device_memory", lambda device: (2 * GIB, 200 << 20))

    def config(steps: int) -> RuntimeConfig:
        cfg = tiny_config(tmp_path, batching={"globalBatch": 8, "mode": "adaptive"}, training={"steps": steps},
                          checkpoint={"everySteps": 1})
        del cfg["batching"]["maxTokensPerGpu"]
        return RuntimeConfig.model_validate(cfg)

    def observed(step: int) -> tuple[int, int, int]:
        """(start step, budget before and after observing step `step` with a low measured peak) of
        a trainer built from the checkpoint directory as it is."""
        trainer = dpo.DPOTrainer(config(4), init_from_env())
        try:
            rec = SimpleNamespace(step=step, seconds=1.0, fields={"peakMemoryFraction": (5 << 20) / (2 * GIB)})
            before = trainer.batcher.budget
            trainer.observe(rec, SimpleNamespace(step_min=None))
            return trainer.start_step, before, trainer.batcher.budget
        finally:
            trainer.checkpointer.close()
            trainer.close()

    start, planned, calibrated = observed(1)
    assert start == 0 and calibrated > planned  # the job's first step calibrates
    learned = dpo.train(config(2)).records[-1]["tokenBudget"]  # on the CPU: no peak, nothing calibrated
    start, before, after = observed(3)
    assert (start, before) == (2, learned)
    assert after == learned


def test_a_lora_actors_critic_is_planned_as_trained_in_full(tmp_path, monkeypatch):
    """The critic takes the actor's model spec but not its adapters (CriticWorker trains every
    parameter): its gradients and AdamW moments are those of the whole model."""
    from rlkube.runtime.infra.distributed import init_from_env
    from rlkube.runtime.trainers.plan_request import plan_rl_memory

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(plan_request, "device_memory", lambda device: (8 * GIB, 200 << 20))
    cfg = rl_config(tmp_path, "ppo", model={"lora": {"rank": 4, "targetModules": ["q_proj", "v_proj"]}})
    config = RuntimeConfig.model_validate(cfg)
    made = plan_rl_memory(config, init_from_env(config.device_map), {"actor", "critic"}, True, 32, 16)
    critic = plan_request.held_model("critic", config.model.model_copy(update={"lora": None}), 1, True)
    assert critic.trainable == critic.params
    assert made.terms["criticGradients"] == critic.gradients
    assert made.terms["criticAdamW"] == critic.optimizer
    assert made.terms["actorGradients"] < made.terms["criticGradients"] // 10  # the actor trains adapters only
