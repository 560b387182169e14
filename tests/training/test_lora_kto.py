"""LoRA on the actor (one base copy, learns DPO and GRPO, generates with the adapters, saves) and
KTO on the toy preference task. Each run is a few seconds on one CPU thread."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlkube.runtime.contract.config import LoraSpec, RuntimeConfig
from rlkube.runtime.engine.models import parameter_storage_bytes

from .conftest import tiny_config
from .rl_common import TINY_MODEL, rl_config

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"rank": 8, "alpha": 16, "targetModules": ALL_LINEAR}




def test_lora_dpo_holds_one_base_copy_and_learns(tmp_path):
    from rlkube.runtime.engine.lora import ReferenceView

    torch.set_num_threads(1)
    cfg = RuntimeConfig.model_validate(tiny_config(tmp_path / "lora", model={"lora": LORA}, training={"lr": 1e-2}))
    full_cfg = RuntimeConfig.model_validate(tiny_config(tmp_path / "full"))
    from rlkube.runtime.trainers.base import train_on_this_rank
    from rlkube.runtime.trainers.dpo import DPOTrainer

    held = {}

    def measure(trainer_cls):
        def make(c, ctx):
            t = trainer_cls(c, ctx)
            ref = t.reference.actor if isinstance(t.reference, ReferenceView) else t.reference
            held[c.model.lora is not None] = (parameter_storage_bytes(t.policy, ref), t)
            return t
        return make

    result = train_on_this_rank(measure(DPOTrainer), cfg, None)
    full_cfg.training.steps = 1
    train_on_this_rank(measure(DPOTrainer), full_cfg, None)
    lora_bytes, lora_trainer = held[True]
    full_bytes, _ = held[False]
    base = parameter_storage_bytes(lora_trainer.policy) - sum(
        p.numel() * p.element_size() for p in lora_trainer.policy.parameters() if p.requires_grad)
    adapters = lora_bytes - base
    assert full_bytes == pytest.approx(2 * base, rel=1e-6)  # actor + frozen copy
    assert lora_bytes == base + adapters and adapters < 0.2 * base  # one base copy + adapters
    print(json.dumps({"baseBytes": base, "adapterBytes": adapters, "fullReferenceBytes": full_bytes,
                      "loraBytes": lora_bytes, "savedBytes": full_bytes - lora_bytes}))
    # only the adapters have AdamW moments
    state = lora_trainer.optimizer.state
    assert state and all(p.requires_grad for p in state)
    names = {id(p): n for n, p in lora_trainer.policy.named_parameters()}
    assert all("lora_" in names[id(p)] for p in state)
    acc = result.series("accuracy")
    assert acc[0] < 0.6 and sum(acc[-4:]) / 4 > 0.85, acc


def test_lora_grpo_raises_mean_reward(tmp_path):
    from rlkube.runtime.trainers.rl import train

    torch.set_num_threads(1)
    # A larger init range than the RL default: body-only adapters move logits through a normalised
    # hidden state, so the lm head's rows must be large enough for that to sharpen the distribution.
    model = {"config": {**TINY_MODEL, "initializer_range": 0.2}, "lora": LORA}
    cfg = rl_config(tmp_path, "grpo", model=model, training={"lr": 3e-2, "clipHigh": 0.28})
    rewards = train(RuntimeConfig.model_validate(cfg)).series("rewardMean")
    assert sum(rewards[:3]) / 3 < 0.2
    assert sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3 > 0.4, rewards


def tiny_lm(seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(TINY_MODEL)
    hf = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf, dtype=torch.float32, attn_implementation="sdpa")


def test_hybrid_engine_generates_with_the_adapters_and_merged_export_matches(tmp_path):
    from transformers import AutoModelForCausalLM

    from rlkube.runtime.engine.generation import SamplingParams
    from rlkube.runtime.engine.hybrid_engine import HybridEngine
    from rlkube.runtime.engine.lora import adapters_disabled, add_lora, save_adapter
    from rlkube.runtime.engine.policy import PolicyModel

    lm = tiny_lm()
    base = copy.deepcopy(lm)
    peft_model = add_lora(lm, LoraSpec(rank=4, target_modules=ALL_LINEAR))
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.5)
    engine = HybridEngine(PolicyModel(lm))
    prompts = torch.randint(3, 259, (2, 5))
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, eos_token_id=None, pad_token_id=0)
    adapted = engine.generate(prompts, torch.ones_like(prompts), greedy).sequences
    with adapters_disabled(lm):
        off = engine.generate(prompts, torch.ones_like(prompts), greedy).sequences
    plain = HybridEngine(PolicyModel(base)).generate(prompts, torch.ones_like(prompts), greedy).sequences
    assert torch.equal(off, plain) and not torch.equal(adapted, plain)
    assert all(p.requires_grad == ("lora_" in n) for n, p in lm.named_parameters())  # switched back

    merged_dir = save_adapter(peft_model, tmp_path / "merged", merge=True)
    adapter_dir = save_adapter(peft_model, tmp_path / "adapter")
    assert (adapter_dir / "adapter_config.json").exists() and (adapter_dir / "adapter_model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), attn_implementation="sdpa")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    again = HybridEngine(PolicyModel(merged)).generate(prompts, torch.ones_like(prompts), greedy).sequences
    assert torch.equal(again, adapted)


def test_lora_refuses_layers_it_cannot_train():
    from rlkube.runtime.engine.lora import add_lora

    with pytest.raises(ValueError, match="model.lora.targetModules: lm_head"):
        add_lora(tiny_lm(), LoraSpec(target_modules=["q_proj", "lm_head"]))


def test_kto_learns_the_toy_preferences(tmp_path):
    from rlkube.runtime.trainers.kto import train

    torch.set_num_threads(1)
    cfg = RuntimeConfig.model_validate(tiny_config(tmp_path, algorithm="kto", training={"lr": 1e-3}))
    result = train(cfg)
    recs = result.records
    assert recs[0]["loss"] == pytest.approx(0.5, abs=1e-4)  # policy == reference: 1 - sigmoid(0)
    assert recs[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    late = recs[-4:]
    assert sum(r["loss"] for r in late) / 4 < 0.47
    assert sum(r["margin"] for r in late) / 4 > 0.2
    assert sum(r["accuracy"] for r in late) / 4 > 0.6


def test_lora_kto_holds_no_reference_copy(tmp_path):
    from rlkube.runtime.engine.lora import ReferenceView
    from rlkube.runtime.trainers.kto import train

    torch.set_num_threads(1)
    cfg = RuntimeConfig.model_validate(
        tiny_config(tmp_path, algorithm="kto", model={"lora": LORA}, training={"lr": 1e-2, "steps": 6}))
    result = train(cfg)
    assert result.records[-1]["loss"] < result.records[0]["loss"]
    assert ReferenceView(torch.nn.Linear(1, 1)).state_dict() == {}  # the view owns nothing
