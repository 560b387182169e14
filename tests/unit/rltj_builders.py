"""Small builders of RLTrainingJob specs and objects for the API, CRD and CLI tests."""

from __future__ import annotations

import copy
from typing import Any

TINY_CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 259,
}
REWARD_FUNCTION = "rlkube.runtime.rewards:target_pattern"

ROLES = {
    "dpo": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
    "kto": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
    "grpo": {
        "actor": {"gpus": 2},
        "reference": {"colocateWith": "actor"},
        "reward": {"gpus": 0, "function": REWARD_FUNCTION},
    },
    "ppo": {
        "actor": {"gpus": 2},
        "critic": {"gpus": 1},
        "reward": {"gpus": 1, "model": {"path": "/models/reward"}},
        "reference": {"colocateWith": "actor"},
    },
}


def spec(algorithm: str = "dpo", **overrides: Any) -> dict[str, Any]:
    """A valid spec dict (camelCase, as in a manifest); keyword overrides replace top-level keys."""
    out: dict[str, Any] = {
        "algorithm": algorithm,
        "model": {"config": dict(TINY_CONFIG), "dtype": "float32"},
        "roles": copy.deepcopy(ROLES[algorithm]),
        "data": {"source": "synthetic", "format": "synthetic"},
        "image": "localhost/rlkube/runtime-cpu:dev",
    }
    out.update(copy.deepcopy(overrides))
    return out


def job(name: str = "tiny", **spec_overrides: Any) -> dict[str, Any]:
    """A valid RLTrainingJob object dict."""
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec(**spec_overrides),
    }


def roles(**by_name: dict[str, Any]) -> dict[str, Any]:
    """A roles mapping from keyword arguments: roles(actor={'gpus': 1}, ...)."""
    return copy.deepcopy(by_name)
