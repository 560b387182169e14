"""Partial freezing (engine/freezing.py, training.trainableModules): frozen parameters get no
gradient and no optimizer state, and the start record's numbers shrink with them."""

from __future__ import annotations

import pytest
import torch

from rlkube.runtime.contract.config import ModelSpec, TrainingSpec
from rlkube.runtime.engine.freezing import apply_trainable_modules, freeze_except, parameter_budget
from rlkube.runtime.engine.logprobs import SequenceLogprobs
from rlkube.runtime.engine.models import build_causal_lm
from rlkube.runtime.infra.errors import ConfigError

TINY = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259, "max_position_embeddings": 64}


def tiny_lm(tied: bool = False) -> torch.nn.Module:
    spec = ModelSpec(config={**TINY, "tie_word_embeddings": tied}, dtype="float32", attention="sdpa")
    return build_causal_lm(spec, torch.device("cpu"))[0]


def test_frozen_parameters_get_no_gradient_and_no_optimizer_state():
    lm = tiny_lm()
    counts = freeze_except(lm, ["layers.1.", "lm_head"])
    trained = {n for n, p in lm.named_parameters() if p.requires_grad}
    assert trained and all("layers.1." in n or n.startswith("lm_head") for n in trained)
    assert counts["trainable"] == sum(p.numel() for p in lm.parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=0.1)  # as Trainer.adamw
    lm(input_ids=torch.randint(0, 259, (2, 8))).logits.square().mean().backward()
    optimizer.step()
    for name, p in lm.named_parameters():
        assert (p.grad is not None) == (name in trained), name
        assert (p in optimizer.state) == (name in trained), name


def test_the_start_record_numbers_shrink_with_freezing():
    full = parameter_budget(SequenceLogprobs(tiny_lm()))
    lm = tiny_lm()
    freeze_except(lm, ["layers.1."])
    part = parameter_budget(SequenceLogprobs(lm))
    assert part["trainableParameters"] + part["frozenParameters"] == full["trainableParameters"]
    assert 0 < part["optimizerStateBytes"] < full["optimizerStateBytes"] / 2
    assert part["optimizerStateBytes"] == 2 * 4 * part["trainableParameters"]  # two fp32 moments
    assert part["reducedBytesPerStep"] == full["reducedBytesPerStep"] == 0  # one rank: nothing reduced


def test_a_tied_head_trains_when_either_of_its_names_is_given():
    lm = tiny_lm(tied=True)
    freeze_except(lm, ["lm_head"])
    assert lm.get_input_embeddings().weight.requires_grad
    assert [n for n, p in lm.named_parameters() if p.requires_grad] == ["model.embed_tokens.weight"]


def test_a_pattern_that_matches_nothing_names_its_field_and_real_names():
    with pytest.raises(ConfigError, match=r"training\.trainableModules\[1\]: 'layers\.9\.' matches no parameter.*"
                                          r"model\.embed_tokens\.weight"):
        freeze_except(tiny_lm(), ["lm_head", "layers.9."])
    with pytest.raises(ConfigError, match="cannot be combined with model.lora"):
        apply_trainable_modules(tiny_lm(), ["lm_head"], lora=object())
    lm = tiny_lm()
    apply_trainable_modules(lm, None)
    assert all(p.requires_grad for p in lm.parameters())


def test_the_config_field_is_validated():
    assert TrainingSpec.model_validate({"trainableModules": ["layers.1."]}).trainable_modules == ["layers.1."]
    for bad in ([], [""]):
        with pytest.raises(ValueError):
            TrainingSpec.model_validate({"trainableModules": bad})
