"""The Hugging Face export (infra/export.py): a directory transformers reads back with the same
logits, atomic replacement, shards, the byte tokenizer as an equivalent HF tokenizer, LoRA folded
in, and the export of a committed checkpoint in one process."""

from __future__ import annotations

import json

import pytest
import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.data.tokenizer_export import byte_tokenizer_hf
from rlkube.runtime.engine.logprobs import SequenceLogprobs
from rlkube.runtime.engine.models import build_causal_lm
from rlkube.runtime.infra import export
from rlkube.runtime.infra.checkpoint import Checkpointer
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import ConfigError

TINY = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259, "max_position_embeddings": 64}


def tiny_lm(tied: bool = True, seed: int = 0) -> torch.nn.Module:
    spec = ModelSpec(config={**TINY, "tie_word_embeddings": tied}, dtype="float32", attention="sdpa")
    return build_causal_lm(spec, torch.device("cpu"), seed=seed)[0]


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[257, 104, 105, 33, 10, 200, 3], [257, 1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path))


@pytest.mark.parametrize("tied", [True, False])
def test_a_written_directory_loads_back_with_equal_logits(tmp_path, tied):
    lm = tiny_lm(tied)
    state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    out = export.write_model_dir(lm.config.to_dict(), state, "byte", tmp_path / "model", {"step": 7})
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", export.EXPORT_META} <= names
    assert torch.equal(logits(load(out)), logits(lm))
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (257, 258, 256)
    assert json.loads((out / export.EXPORT_META).read_text())["step"] == 7
    assert json.loads((out / "config.json").read_text())["use_cache"] is True


def test_a_new_export_replaces_the_old_one_atomically_and_leaves_nothing_beside_it(tmp_path):
    first, second = tiny_lm(seed=0), tiny_lm(seed=1)
    dest = tmp_path / "export"
    (tmp_path / ".export.partial-999").mkdir()  # a write that died half-way
    for step, lm in ((1, first), (2, second)):
        export.write_model_dir(lm.config.to_dict(), dict(lm.state_dict()), "byte", dest, {"step": step})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    assert torch.equal(logits(load(dest)), logits(second))


def test_a_large_model_is_split_into_shards(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "MAX_SHARD_SIZE", "20KB")
    lm = tiny_lm(tied=False)
    out = export.write_model_dir(lm.config.to_dict(), dict(lm.state_dict()), "byte", tmp_path / "m", {"step": 1})
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    assert torch.equal(logits(load(out)), logits(lm))


def test_the_byte_tokenizer_is_written_as_an_hf_tokenizer_that_encodes_the_same(tmp_path):
    from transformers import AutoTokenizer

    byte_tokenizer_hf().save_pretrained(str(tmp_path))
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    ours = ByteTokenizer()
    for text in ("hello world", "  two  spaces\n\ttab", "héllo wörld ✓ 🙂", "\x00\x7f~!", ""):
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == ours.encode(text), text
        assert hf.decode(ids) == text
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, len(hf)) == (256, 257, 258, 259)
    assert hf("ab").input_ids == [257, 97, 98]  # bos first, as rlkube feeds every prompt
    chat = [{"role": "user", "content": "hi"}]
    assert hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        "<s>" + ours.chat_text(chat, add_generation_prompt=True)


def test_lora_adapters_are_folded_into_the_weights():
    torch.manual_seed(0)
    w, bias, a, b = torch.randn(6, 4), torch.randn(6), torch.randn(2, 4), torch.randn(6, 2)
    state = {"q.base_layer.weight": w, "q.base_layer.bias": bias, "q.lora_A.default.weight": a,
             "q.lora_B.default.weight": b, "norm.weight": torch.ones(4)}
    merged = export.merge_lora(state, scale=0.5)
    assert sorted(merged) == ["norm.weight", "q.bias", "q.weight"]
    assert torch.allclose(merged["q.weight"], w + 0.5 * b @ a) and torch.equal(merged["q.bias"], bias)
    plain = {"q.weight": w}
    assert export.merge_lora(plain, 0.5) is plain


def committed_checkpoint(root, lm, prefix: str = "") -> None:
    """A checkpoint as a trainer writes it: the wrapped model, an optimizer, the model's meta."""
    wrapper = SequenceLogprobs(lm)
    trainable = torch.nn.ModuleDict({"actor": wrapper}) if prefix else wrapper
    optimizer = torch.optim.AdamW(trainable.parameters(), lr=0.1)
    ck = Checkpointer(str(root), keep=2, ctx=DistContext())
    spec = ModelSpec(config={**TINY, "tie_word_embeddings": True})
    ck.save(5, trainable, optimizer, {"seed": 0}, model_meta=export.model_meta(lm, spec, prefix))
    ck.close()


@pytest.mark.parametrize("prefix", ["", "actor."])  # DPO's trainable, and the RL trainers' ModuleDict
def test_a_committed_checkpoint_exports_in_one_process(tmp_path, prefix):
    lm = tiny_lm()
    committed_checkpoint(tmp_path / "ckpt", lm, prefix)
    record = export.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert record["step"] == 5 and record["checkpoint"].endswith("step-000000005")
    assert torch.equal(logits(load(tmp_path / "out")), logits(lm))
    with pytest.raises(ConfigError, match="--to: .* not empty"):
        export.export_checkpoint(tmp_path / "ckpt" / "step-000000005", tmp_path / "out")
    export.export_checkpoint(tmp_path / "ckpt" / "step-000000005", tmp_path / "out", overwrite=True)


def test_export_errors_name_what_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="not a committed checkpoint"):
        export.export_checkpoint(tmp_path, tmp_path / "out")
    committed_checkpoint(tmp_path / "ckpt", tiny_lm())
    meta = tmp_path / "ckpt" / "step-000000005" / "rlkube-checkpoint.json"
    recorded = json.loads(meta.read_text())
    meta.write_text(json.dumps({**recorded, "model": {**recorded["model"], "tokenizer": "/no/such/tokenizer"}}))
    with pytest.raises(ConfigError, match="--tokenizer"):
        export.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    meta.write_text(json.dumps({k: v for k, v in recorded.items() if k != "model"}))
    with pytest.raises(ConfigError, match="records no model"):
        export.export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
