"""A bad runtime config is a ConfigError naming the field path (the CLI exits 3 with it)."""

import pytest

from rlkube.runtime.cli import load_config, main
from rlkube.runtime.infra.errors import EXIT_CONFIG, ConfigError

GOOD = """
algorithm: dpo
model: {config: {model_type: qwen2}}
roles: {actor: {gpus: 1}, reference: {colocateWith: actor}}
data: {source: x, format: synthetic}
"""


def write(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return str(p)


def test_good_config_loads_and_gets_a_device_map(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.device_map == {"actor": [0], "reference": [0]}


@pytest.mark.parametrize(
    "extra, path",
    [
        ("batching: {maxMicroBatch: 0}", "batching.maxMicroBatch"),
        ("training: {lr: -1}", "training.lr"),
        ("training: {lossType: hinge}", "training.lossType"),
        ("checkpoint: {evrySteps: 3}", "checkpoint.evrySteps"),
        ("batching: {minMicroBatch: 8, maxMicroBatch: 2}", "maxMicroBatch"),
    ],
)
def test_errors_name_the_field_path(tmp_path, extra, path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, GOOD + extra + "\n"))
    assert path in str(e.value)
    assert str(tmp_path / "run.yaml") in str(e.value)


GRPO = """
algorithm: grpo
model: {config: {model_type: qwen2}}
roles: {actor: {gpus: 1}, reward: {gpus: 0, function: 'rlkube.runtime.rewards:target_pattern'}}
data: {source: x, format: synthetic}
"""


@pytest.mark.parametrize(
    "extra, path",
    [
        ("training: {kl: 0.1}", "training.kl"),
        ("training: {groupSize: 1}", "training.groupSize"),
        ("rollout: {temperature: 0}", "rollout.temperature"),
        ("batching: {memoryFraction: 0.999}", "batching.memoryFraction"),
    ],
)
def test_settings_grpo_cannot_honour_are_refused_at_start(tmp_path, extra, path):
    # The same rules as `rlkube validate` and the CRD (rlkube.runtime.contract.algorithm_settings).
    assert load_config(write(tmp_path, GRPO)).algorithm == "grpo"
    with pytest.raises(ConfigError, match=f"{path}: "):
        load_config(write(tmp_path, GRPO + extra + "\n"))


def test_every_batching_field_applies_to_grpo(tmp_path):
    extra = "batching: {mode: adaptive, minMicroBatch: 2, maxTokensPerGpu: 999, memoryFraction: 0.8}\n"
    batching = load_config(write(tmp_path, GRPO + extra)).batching
    assert (batching.min_micro_batch, batching.max_tokens_per_gpu, batching.memory_fraction) == (2, 999, 0.8)


def test_a_reward_role_without_function_or_model_is_refused_at_start(tmp_path):
    text = GRPO.replace("{gpus: 0, function: 'rlkube.runtime.rewards:target_pattern'}", "{gpus: 1}")
    with pytest.raises(ConfigError, match="roles.reward: set function"):
        load_config(write(tmp_path, text))


def test_dpo_with_a_reward_role_is_rejected(tmp_path):
    text = GOOD.replace("reference: {colocateWith: actor}", "reward: {gpus: 1, model: {path: /models/reward}}")
    with pytest.raises(ConfigError, match="roles.reward"):
        load_config(write(tmp_path, text))


def test_cli_exit_code_3_and_message(tmp_path, capsys):
    assert main(["run", write(tmp_path, GOOD + "training: {steps: 0}\n")]) == EXIT_CONFIG
    assert "training.steps" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "nope.yaml")]) == EXIT_CONFIG
    assert main(["run", write(tmp_path, "- a list\n")]) == EXIT_CONFIG


def test_the_runtime_example_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "runtime" / "dpo-tiny-cpu.yaml"
    cfg = load_config(str(example))
    assert cfg.algorithm == "dpo" and cfg.data.format == "synthetic"
