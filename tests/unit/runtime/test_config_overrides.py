"""`python -m rlkube.runtime run CONFIG --set FIELD=VALUE`: values read as YAML (kubectl's floats,
YAML 1.1's on/off kept as words), nested fields made where missing, mistakes named, and the
result validated like the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkube.runtime.cli import load_config
from rlkube.runtime.infra.config_overrides import apply_overrides, parse_override
from rlkube.runtime.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "runtime" / "dpo-quickstart.yaml"


@pytest.mark.parametrize("text,path,value", [
    ("model.path=./my-model", ["model", "path"], "./my-model"),
    ("training.steps=5", ["training", "steps"], 5),
    ("training.lr=1e-5", ["training", "lr"], 1e-5),
    ("training.lr=5.0e-7", ["training", "lr"], 5e-7),
    ("model.compile=off", ["model", "compile"], "off"),
    ("model.gradientCheckpointing=true", ["model", "gradientCheckpointing"], True),
    ("training.trainableModules=[lm_head, layers.1.]", ["training", "trainableModules"], ["lm_head", "layers.1."]),
    ("roles.critic={gpus: 1}", ["roles", "critic"], {"gpus": 1}),
    ("data.source=a=b.jsonl", ["data", "source"], "a=b.jsonl"),
])
def test_values_are_read_as_yaml(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["model.path", "=x", "model..path=x", "model.path x"])
def test_a_malformed_override_is_named(text):
    with pytest.raises(ConfigError, match="expected FIELD=VALUE"):
        parse_override(text)


def test_overrides_apply_in_order_without_changing_the_original():
    config = {"model": {"path": "a"}, "training": {"steps": 1}}
    out = apply_overrides(config, ["model.path=b", "training.steps=2", "training.steps=3", "export.dir=./out"])
    assert out == {"model": {"path": "b"}, "training": {"steps": 3}, "export": {"dir": "./out"}}
    assert config == {"model": {"path": "a"}, "training": {"steps": 1}}
    with pytest.raises(ConfigError, match="model.path is 'a' in the config, not a mapping"):
        apply_overrides(config, ["model.path.x=1"])


def test_overridden_config_is_validated_like_the_file():
    config = load_config(str(QUICKSTART), ["model.path=/m", "data.source=/d.jsonl", "training.steps=7"])
    assert (config.model.path, config.data.source, config.training.steps) == ("/m", "/d.jsonl", 7)
    with pytest.raises(ConfigError, match="training.steps"):
        load_config(str(QUICKSTART), ["training.steps=-1"])
