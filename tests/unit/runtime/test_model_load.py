"""Loading a saved checkpoint: straight onto the device, tensor by tensor, same weights."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.engine import models

TINY = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 64}


def saved(tmp_path, tied):
    torch.manual_seed(3)
    fields = dict(TINY)
    cfg = AutoConfig.for_model(fields.pop("model_type"), tie_word_embeddings=tied, **fields)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(tmp_path)
    return model


def without_accelerate(monkeypatch):
    """These tests cover the loader's own path; with accelerate installed (the dev extras pull it in
    through trl) load_pretrained would hand the work to from_pretrained with a device map instead."""
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))


def spec(path):
    return ModelSpec.model_validate({"path": str(path), "dtype": "float32", "attention": "sdpa"})


def test_checkpoint_is_copied_into_a_model_built_on_the_device(tmp_path, monkeypatch):
    for tied in (True, False):
        where = tmp_path / str(tied)
        original = saved(where, tied)

        def no_host_load(*a, **k):
            raise AssertionError("from_pretrained would build a host copy first")

        without_accelerate(monkeypatch)
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_host_load)
        model, _ = models.build_causal_lm(spec(where), torch.device("cpu"))
        monkeypatch.undo()
        ours = dict(model.named_parameters(remove_duplicate=False))
        for name, p in original.named_parameters(remove_duplicate=False):
            assert torch.equal(ours[name], p), name
        ids = torch.tensor([[1, 5, 9, 2]])
        assert torch.allclose(model(ids).logits, original(ids).logits, atol=1e-6)
        # built to be trained: in eval mode transformers would skip gradient checkpointing
        assert all(m.training for m in model.modules())


def test_unknown_tensor_names_fall_back_to_from_pretrained_with_a_warning(tmp_path, monkeypatch):
    saved(tmp_path, tied=True)
    file = tmp_path / "model.safetensors"
    tensors = {f"renamed.{k}": v for k, v in load_file(str(file)).items()}
    save_file(tensors, str(file), metadata={"format": "pt"})
    calls = []
    real = AutoModelForCausalLM.from_pretrained

    def counted(*a, **k):
        calls.append(a)
        return real(*a, **k)

    without_accelerate(monkeypatch)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    monkeypatch.setattr(models, "warn_once", lambda key, msg: calls.append(key))
    model, _ = models.build_causal_lm(spec(tmp_path), torch.device("cpu"))
    assert "model-load" in calls and len(calls) == 2
    assert all(m.training for m in model.modules())  # from_pretrained's eval mode is not kept


def test_the_frozen_reference_copy_drops_checkpointing_without_a_deprecation_warning():
    """frozen_copy read transformers' deprecated `is_gradient_checkpointing`, so every DPO run's
    log carried its FutureWarning once per rank (and model.gradientCheckpointing two more)."""
    import warnings

    fields = dict(TINY)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        models.activation_checkpointing(model, True)  # as build_causal_lm does for model.gradientCheckpointing
        ref = models.frozen_copy(model)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in ref.modules())
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())  # the actor keeps it
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())


def test_activation_checkpointing_recomputes_to_the_same_gradients():
    fields = dict(TINY)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_config(cfg)
    checkpointed = AutoModelForCausalLM.from_config(cfg)
    checkpointed.load_state_dict(plain.state_dict())
    models.activation_checkpointing(checkpointed, True)
    ids = torch.randint(0, TINY["vocab_size"], (2, 12))
    for model in (plain, checkpointed):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.modules())
    assert not any(getattr(m, "gradient_checkpointing", False) for m in plain.modules())
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_evaluating_switches_to_eval_mode_and_back_even_on_an_error():
    fields = dict(TINY)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    for start in (True, False):
        model.train(start)
        with models.evaluating(model):
            assert not any(m.training for m in model.modules())
        assert all(m.training == start for m in model.modules())
        with pytest.raises(KeyError), models.evaluating(model):
            raise KeyError("x")
        assert all(m.training == start for m in model.modules())
