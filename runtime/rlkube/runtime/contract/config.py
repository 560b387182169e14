"""The runtime's whole input, and the one declaration of a run's sections.

`RunSections` declares the sections of a run (`contract.sections`: model, roles, data, batching,
training, rollout, checkpoint, export, each in its own module with its own rules) and runs the
rules across them (`algorithm_settings`). `RuntimeConfig` is `RunSections` plus what one trainer
process needs; the operator's `RLTrainingJobSpec` is `RunSections` plus what only the operator
reads, and hands the sections to the trainer as they are.

Every section is imported from here (the sections and their own rules, and the shared bounds of
`contract.spec`), so that `config` stays the one place to import the contract's models from. The
modules that build the rules across sections import `contract.sections` instead, so this
module's import of them is not a circle.

Field names are snake_case in Python and camelCase on the wire (YAML, the CRD). Unknown fields
are errors. This module must stay importable without torch: the operator imports it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rlkube.runtime.contract.algorithm_settings import SPEC_RULES
from rlkube.runtime.contract.algorithms import AlgorithmName
from rlkube.runtime.contract.sections import (
    EVAL_SOURCE,
    MICRO_BATCH_BOUNDS,
    MODEL_SOURCE,
    ROLE_SOURCE,
    BatchingSpec,
    CheckpointSpec,
    DataFields,
    DataSpec,
    EnvironmentSpec,
    ExportSpec,
    LoraSpec,
    ModelSpec,
    RoleSpec,
    RolesSpec,
    RolloutSpec,
    ToolsSpec,
    TrainingSpec,
    device_map,
)
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, ROLE_NAMES, Spec

__all__ = [
    "EVAL_SOURCE", "MAX_NAME_LEN", "MAX_PATH_LEN", "MICRO_BATCH_BOUNDS", "MODEL_SOURCE", "ROLE_NAMES", "ROLE_SOURCE",
    "BatchingSpec", "CheckpointSpec", "DataFields", "DataSpec", "EnvironmentSpec", "ExportSpec", "LoraSpec",
    "ModelSpec", "RoleSpec", "RolesSpec", "RolloutSpec", "RunSections", "RuntimeConfig", "ToolsSpec", "TrainingSpec",
    "device_map",
]


class RunSections(Spec):
    """The sections of a training run, declared once: what to train (algorithm, model, roles, data)
    and how (batching, training, rollout, checkpoint, export), with the rules across them
    (`algorithm_settings`). `RuntimeConfig` adds what one trainer process needs; the operator's
    `RLTrainingJobSpec` adds what only the operator reads (placement, elasticity, run policy, the
    pods), and hands these sections to the trainer unchanged (`sections`)."""

    # The rules across sections (`algorithm_settings`); the job spec adds its own in `problems`.
    RULES = SPEC_RULES

    algorithm: AlgorithmName = Field(
        description="RL algorithm: dpo (preference pairs, no rollouts), kto (completions labelled "
        "desirable or not, no rollouts), ppo (critic and GAE), or grpo (group-relative advantages, no "
        "critic). Immutable."
    )
    model: ModelSpec = Field(description="The actor's model (the one being trained). Immutable.")
    roles: RolesSpec = Field(
        description="The job's roles and their device groups: each role has GPUs of its own or "
        "colocates with another role, and the environment service. Immutable, except "
        "roles.environment.replicas."
    )
    data: DataSpec = Field(description="Training data (preference pairs for dpo, prompts for ppo/grpo).")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Batch sizing.")
    training: TrainingSpec = Field(
        default_factory=TrainingSpec, description="Optimizer and algorithm knobs."
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Generation settings (ppo, grpo).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    export: ExportSpec = Field(
        default_factory=ExportSpec,
        description="The trained model as a Hugging Face directory; its path and step appear in status.outputs.",
    )

    def sections(self) -> dict[str, Any]:
        """The run's sections by field name, as they are (for a `RuntimeConfig` made of them)."""
        return {name: getattr(self, name) for name in RunSections.model_fields}


class RuntimeConfig(RunSections):
    """Everything one trainer process needs; rendered by the operator into /etc/rlkube/run.yaml."""

    device_map: dict[str, list[int]] | None = Field(
        default=None,
        description="Global ranks of each role. Written by the operator; computed from roles when unset.",
    )
    progress_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of /progress and /metrics on rank 0 (0: off)."
    )
    output_dir: str = Field(default="/tmp/rlkube", max_length=MAX_PATH_LEN, description="Logs and caches.")

    @model_validator(mode="after")
    def _default_device_map(self) -> RuntimeConfig:
        if self.device_map is None:
            self.device_map = device_map(self.roles)
        return self
