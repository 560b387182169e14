"""Which mode each RL model runs in. A model loaded from a path comes out of from_pretrained in
eval mode, and the critic stayed there: transformers skips gradient checkpointing in eval mode
(model.gradientCheckpointing did nothing for it), and its compiled layers took a training graph
of their own beside the actor's, which a generation had switched to train mode. Now every pass
with a backward runs in train mode and every pass without one (generation, old log-probs,
values, reference) in eval mode."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.engine.models import decoder_layers
from rlkube.runtime.infra.distributed import init_from_env
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import TINY_MODEL, rl_config

pytestmark = pytest.mark.slow


def test_ppo_trains_in_train_mode_with_checkpointing_and_scores_in_eval_mode(tmp_path):
    fields = dict(TINY_MODEL)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields)).save_pretrained(
        tmp_path / "model")
    cfg = rl_config(tmp_path, "ppo", training={"steps": 1, "lr": 1e-3, "seed": 0, "kl": 0.05, "ppoEpochs": 2},
                    batching={"globalBatch": 8, "maxMicroBatch": 8, "mode": "fixed"})
    cfg["model"] = {"path": str(tmp_path / "model"), "dtype": "float32", "attention": "sdpa",
                    "gradientCheckpointing": True}
    cfg["roles"]["reference"] = {"colocateWith": "actor"}
    trainer = RLTrainer(RuntimeConfig.model_validate(cfg), init_from_env({"actor": [0]}))
    calls: list[tuple[str, bool, bool]] = []  # (model, training, grad enabled) of each attention call
    forwards = {"actor": 0, "critic": 0}  # forwards with gradients of each trained model's body
    try:
        models = {"actor": trainer.actor.model.lm, "critic": trainer.critic.model.lm,
                  "reference": trainer.scorer.reference.lm}
        for name, lm in models.items():
            # The attention runs inside the layer's checkpointed forward, so it is called again
            # when the backward recomputes the layer; the body's forward is not.
            decoder_layers(lm)[0].self_attn.register_forward_pre_hook(
                lambda module, args, name=name: calls.append((name, module.training, torch.is_grad_enabled())))
            if name in forwards:
                lm.get_decoder().register_forward_pre_hook(
                    lambda module, args, kwargs, name=name: forwards.update({name: forwards[name] + torch.is_grad_enabled()}),
                    with_kwargs=True)
        trainer.step(0)
    finally:
        trainer.close()
    seen = set(calls)
    for name in models:
        assert (name, True, False) not in seen, f"{name}: a pass without gradients ran in train mode"
    for name in ("actor", "critic"):
        assert (name, False, True) not in seen, f"{name}: trained in eval mode"
        assert (name, True, True) in seen, f"{name}: never trained"
        assert (name, False, False) in seen, f"{name}: never scored"
    # checkpointing engaged: each training forward's attention ran again in the backward
    for name in ("actor", "critic"):
        trained = [c for c in calls if c[0] == name and c[2]]
        assert forwards[name] >= 2 and len(trained) == 2 * forwards[name], (name, len(trained), forwards[name])
    assert {c for c in seen if c[0] == "reference"} == {("reference", False, False)}
