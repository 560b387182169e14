"""A run that fails says why in its termination message (contract.progress TERMINATION_ERROR_KEY),
and a mistake in the config or its data exits EXIT_CONFIG (not retried by the operator) instead
of crashing with exit 1 and burning every restart."""

import json

import pytest

from rlkube.runtime.cli import load_config, main, run_in_process
from rlkube.runtime.contract import failure
from rlkube.runtime.contract import progress as report
from rlkube.runtime.infra.errors import EXIT_CONFIG, ConfigError, DataError
from rlkube.runtime.infra.progress import ENV_TERMINATION_LOG, write_termination_error

DPO = """
algorithm: dpo
model: {config: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2,
                 num_key_value_heads: 1, vocab_size: 259}}
roles: {actor: {gpus: 1}, reference: {colocateWith: actor}}
"""
GRPO = """
algorithm: grpo
model: {config: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2,
                 num_key_value_heads: 1, vocab_size: 259}}
roles: {actor: {gpus: 1}, reward: {colocateWith: actor, function: "rlkube.runtime.rewards:target_pattern"}}
"""


@pytest.fixture
def termination_log(tmp_path, monkeypatch):
    path = tmp_path / "termination-log"
    path.write_text("")
    monkeypatch.setenv(ENV_TERMINATION_LOG, str(path))
    monkeypatch.setenv("RLKUBE_PROGRESS_PORT", "0")
    return path


def error_of(path) -> dict:
    return json.loads(path.read_text())[failure.TERMINATION_ERROR_KEY]


def config(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text + f"outputDir: {tmp_path / 'out'}\ncheckpoint: {{dir: {tmp_path / 'ckpt'}}}\n")
    return load_config(str(p))


@pytest.mark.parametrize(("text", "field", "words"), [
    (DPO + "data: {source: MISSING, format: jsonl}\n", "data.source", "does not exist"),
])
def test_config_and_data_errors_exit_3_naming_the_field(tmp_path, termination_log, text, field, words):
    cfg = config(tmp_path, text.replace("MISSING", str(tmp_path / "nowhere.jsonl")))
    assert run_in_process(cfg) == EXIT_CONFIG
    error = error_of(termination_log)
    assert error[failure.ERROR_EXIT] == failure.ERROR_CONFIG and error[failure.ERROR_FIELD] == field
    assert words in error[failure.ERROR_MESSAGE] and "\n" not in error[failure.ERROR_MESSAGE]


def test_an_invalid_config_file_exits_3_with_the_error_in_the_termination_message(tmp_path, termination_log):
    p = tmp_path / "run.yaml"
    p.write_text(DPO + "data: {source: x, format: synthetic}\ntraining: {lr: -1}\n")
    assert main(["run", str(p)]) == EXIT_CONFIG
    error = error_of(termination_log)
    assert error[failure.ERROR_EXIT] == failure.ERROR_CONFIG and "training.lr" in error[failure.ERROR_MESSAGE]


def test_new_tokens_leaving_no_prompt_room_is_a_config_error_naming_the_field(tmp_path, termination_log):
    # Config validation refuses it now (rlkube validate and the CRD too), before any data is read.
    p = tmp_path / "run.yaml"
    p.write_text(GRPO + "data: {source: x, format: synthetic, maxSeqLen: 16}\nrollout: {maxNewTokens: 32}\n")
    assert main(["run", str(p)]) == EXIT_CONFIG
    error = error_of(termination_log)
    assert error[failure.ERROR_EXIT] == failure.ERROR_CONFIG
    assert "rollout.maxNewTokens" in error[failure.ERROR_MESSAGE] and "data.maxSeqLen" in error[failure.ERROR_MESSAGE]


def test_the_error_joins_the_last_report_and_stays_one_line(tmp_path):
    path = tmp_path / "log"
    path.write_text(json.dumps({report.TERMINATION_MESSAGE_KEY: {"step": 7}}))
    assert write_termination_error(failure.ERROR_CRASH, "RuntimeError: two\nlines", path=str(path))
    body = json.loads(path.read_text())
    assert body[report.TERMINATION_MESSAGE_KEY] == {"step": 7}
    assert body[failure.TERMINATION_ERROR_KEY] == {"exit": "crash", "field": "", "message": "RuntimeError: two lines"}


def test_data_errors_are_config_errors_with_a_field_path():
    e = DataError("data.source: /x/train.jsonl:3: field 'prompt' missing")
    assert isinstance(e, ConfigError) and isinstance(e, ValueError)
    assert e.field_path() == "data.source"
    assert ConfigError("a sentence without a field path").field_path() == ""
