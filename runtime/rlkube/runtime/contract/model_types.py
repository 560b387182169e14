"""The Hugging Face model types rlkube trains, and the check of a model directory's config.json.

A model is given by `model.config` (its `model_type` is in the spec, so `rlkube validate`, the
CRD's schema and the runtime's config validation all refuse an unknown one) or by `model.path`
(its config.json is read in the pod: `model_dir_problem` runs before any model is loaded, so an
unknown type exits 3 naming the field, not 1 after a traceback, and costs no restart).

`SUPPORTED_MODEL_TYPES` are decoder-only families whose causal LM and sequence-classification
classes (the reward role) transformers builds and whose blocks `engine/models.decoder_layers`
finds to shard: tests/unit/runtime/test_model_types.py builds a tiny model of each. Torch-free:
the operator imports this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3_text", "phi", "phi3", "olmo", "olmo2", "starcoder2", "stablelm", "smollm3", "gpt2",
    "gpt_neox", "falcon",
)


def model_type_problem(model_type: object) -> str | None:
    """Why `model_type` cannot be trained, or None."""
    if model_type in SUPPORTED_MODEL_TYPES:
        return None
    return f"must be one of {', '.join(SUPPORTED_MODEL_TYPES)}, got {model_type!r}"


def model_dir_problem(path: str) -> str | None:
    """Why the Hugging Face model directory `path` cannot be loaded (no config.json, not JSON, a
    model_type outside SUPPORTED_MODEL_TYPES), or None. Read before loading, in the pod."""
    config = Path(path) / "config.json"
    if not config.is_file():
        what = "is not a directory" if not Path(path).is_dir() else "has no config.json"
        return f"{path} {what} (a Hugging Face model directory holds config.json and the weights)"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return f"{config}: not a JSON object ({e})"
    problem = model_type_problem(model_type)
    return None if problem is None else f"{config}: model_type {problem}"


def spec_models(spec: Any) -> dict[str, Any]:
    """The models of a RuntimeConfig or an RLTrainingJobSpec by field path: the actor's ('model')
    and each role's own ('roles.reward.model')."""
    roles = {f"roles.{name}.model": role.model for name, role in spec.roles.present().items() if role.model}
    return {"model": spec.model, **roles}


def model_type_problems(spec: Any) -> list[str]:
    """Each model given by `config` whose model_type rlkube does not train: one
    'roles.reward.model.config.model_type: why' line each. The CRD's twin is the enum it declares
    on model_type inside the config."""
    return [
        f"{where}.config.model_type: {problem}"
        for where, model in spec_models(spec).items()
        if model.config is not None and (problem := model_type_problem(model.config.get("model_type")))
    ]


def model_problems(config: Any) -> list[str]:
    """Each model of a RuntimeConfig that the pod cannot build: `model_type_problems`, and each
    model given by `path` whose directory cannot be loaded (read in the pod; one 'field: why' line
    each)."""
    return model_type_problems(config) + [
        f"{where}.path: {problem}"
        for where, model in spec_models(config).items()
        if model.path is not None and (problem := model_dir_problem(model.path))
    ]
