"""DPO on the conversational example data (examples/data/chat-preferences.jsonl): the chat
records go through the same trainer as the synthetic pairs, score only the assistant's turns,
and the preference is learned; once with the byte tokenizer, once with a Hugging Face tokenizer
trained in the test (its chat template, its specials)."""

import math

import pytest
import torch

from tests.unit.runtime.data_builders import build_hf_tokenizer

from .conftest import ROOT, tiny_config

DATA = ROOT / "examples" / "data" / "chat-preferences.jsonl"


def chat_config(tmp, steps, **model):
    cfg = tiny_config(tmp, data={"source": str(DATA), "format": "jsonl", "maxSeqLen": 160},
                      training={"steps": steps}, checkpoint={"everySteps": 100})
    cfg["model"]["config"].update(max_position_embeddings=160, **model.pop("config", {}))
    cfg["model"].update(model)
    return cfg


def run(cfg):
    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers.dpo import train

    torch.set_num_threads(1)
    return train(RuntimeConfig.model_validate(cfg))


def test_dpo_learns_the_chat_preferences_with_the_byte_tokenizer(tmp_path):
    result = run(chat_config(tmp_path, steps=10))
    assert result.steps_run == 10
    assert result.losses[0] == pytest.approx(math.log(2), abs=1e-3)  # policy == reference at step 1
    assert all(math.isfinite(x) for x in result.losses)
    assert sum(result.losses[-3:]) / 3 < math.log(2) - 0.2, result.losses


def test_dpo_runs_on_chat_data_with_a_hugging_face_tokenizer(tmp_path):
    tok = build_hf_tokenizer(tmp_path / "tok")
    result = run(chat_config(tmp_path, steps=3, tokenizer=tok, config={"vocab_size": 320}))
    assert result.steps_run == 3 and all(math.isfinite(x) for x in result.losses)
    assert result.losses[0] == pytest.approx(math.log(2), abs=1e-3)
