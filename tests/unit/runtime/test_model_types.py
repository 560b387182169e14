"""The model types rlkube trains (contract/model_types.py), and a model the pod cannot build
failing at once: exit 3 with the field in the termination message, before torch loads a model."""

from __future__ import annotations

import json

import pytest

from rlkube.runtime.cli import load_config, run_in_process
from rlkube.runtime.contract import failure
from rlkube.runtime.contract.model_types import SUPPORTED_MODEL_TYPES, model_dir_problem
from rlkube.runtime.infra.errors import EXIT_CONFIG
from rlkube.runtime.infra.progress import ENV_TERMINATION_LOG

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 64, "vocab_size": 300, "n_embd": 32, "n_layer": 1, "n_head": 2,
        "moe_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4, "pad_token_id": None}


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_supported_type_builds_a_causal_lm_and_a_reward_model_with_layers_to_shard(model_type):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from rlkube.runtime.engine.models import decoder_layers

    config = AutoConfig.for_model(model_type)
    for key, value in TINY.items():
        if hasattr(config, key):
            setattr(config, key, value)
    assert len(decoder_layers(AutoModelForCausalLM.from_config(config))) == 1
    AutoModelForSequenceClassification.from_config(config)


def test_a_model_directory_is_checked_by_its_config_json(tmp_path):
    assert "is not a directory" in model_dir_problem(str(tmp_path / "nowhere"))
    assert "has no config.json" in model_dir_problem(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    assert "not a JSON object" in model_dir_problem(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert "model_type must be one of llama" in model_dir_problem(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert model_dir_problem(str(tmp_path)) is None


ACTOR = "model: {config: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, vocab_size: 259}}\n"


@pytest.mark.parametrize(("text", "field", "words"), [
    ("algorithm: dpo\nmodel: {path: MODEL}\nroles: {actor: {gpus: 1}}\n", "model.path", "model_type must be one of"),
    ("algorithm: dpo\nmodel: {path: EMPTY}\nroles: {actor: {gpus: 1}}\n", "model.path", "has no config.json"),
    ("algorithm: dpo\n" + ACTOR.replace("qwen2", "qwen9") + "roles: {actor: {gpus: 1}}\n",
     "model.config.model_type", "'qwen9'"),
    ("algorithm: grpo\n" + ACTOR + "roles: {actor: {gpus: 1}, reward: {gpus: 0, model: {path: MODEL}}}\n",
     "roles.reward.model.path", "'bert'"),
])
def test_a_model_the_pod_cannot_build_exits_3_naming_the_field(tmp_path, monkeypatch, text, field, words):
    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setenv(ENV_TERMINATION_LOG, str(log))
    monkeypatch.setenv("RLKUBE_PROGRESS_PORT", "0")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "empty").mkdir()
    text = text.replace("MODEL", str(tmp_path / "bert")).replace("EMPTY", str(tmp_path / "empty"))
    path = tmp_path / "run.yaml"
    path.write_text(text + f"data: {{source: x, format: synthetic}}\noutputDir: {tmp_path / 'out'}\n"
                    f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    assert run_in_process(load_config(str(path))) == EXIT_CONFIG
    error = json.loads(log.read_text())[failure.TERMINATION_ERROR_KEY]
    assert (error[failure.ERROR_EXIT], error[failure.ERROR_FIELD]) == (failure.ERROR_CONFIG, field)
    assert words in error[failure.ERROR_MESSAGE] and "\n" not in error[failure.ERROR_MESSAGE]
