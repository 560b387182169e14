"""The runtime's whole input: one pydantic model, `RuntimeConfig`, of the sections in
`contract.sections` (and `contract.rollout`), checked across sections by `algorithm_settings`.

Every section is imported from here (the sections and their own rules, the rollout section, and
the shared bounds of `contract.spec`), so that `config` stays the one place to import the
contract's models from. The modules that build the rules across sections import
`contract.sections` instead, so this module's import of them is not a circle.

Field names are snake_case in Python and camelCase on the wire (YAML, the CRD). Unknown fields
are errors. This module must stay importable without torch: the operator imports it.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rlkube.runtime.contract.algorithm_settings import algorithm_setting_problems
from rlkube.runtime.contract.algorithms import AlgorithmName
from rlkube.runtime.contract.rollout import RolloutSpec
from rlkube.runtime.contract.sections import (
    EVAL_SOURCE,
    MICRO_BATCH_BOUNDS,
    MODEL_SOURCE,
    ROLE_SOURCE,
    BatchingSpec,
    CheckpointSpec,
    DataFields,
    DataSpec,
    ExportSpec,
    LoraSpec,
    ModelSpec,
    RoleSpec,
    RolesSpec,
    TrainingSpec,
    device_map,
)
from rlkube.runtime.contract.spec import MAX_NAME_LEN, MAX_PATH_LEN, ROLE_NAMES, Spec

__all__ = [
    "EVAL_SOURCE", "MAX_NAME_LEN", "MAX_PATH_LEN", "MICRO_BATCH_BOUNDS", "MODEL_SOURCE", "ROLE_NAMES", "ROLE_SOURCE",
    "BatchingSpec", "CheckpointSpec", "DataFields", "DataSpec", "ExportSpec", "LoraSpec", "ModelSpec", "RoleSpec",
    "RolesSpec", "RolloutSpec", "RuntimeConfig", "TrainingSpec", "device_map",
]


class RuntimeConfig(Spec):
    """Everything one trainer process needs; rendered by the operator into /etc/rlkube/run.yaml."""

    algorithm: AlgorithmName = Field(description="RL algorithm.")
    model: ModelSpec = Field(description="The actor's model.")
    roles: RolesSpec = Field(description="Roles and their device groups.")
    data: DataSpec = Field(description="Training data.")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Batch sizing.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Optimizer and algorithm knobs.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Generation (PPO, GRPO).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    export: ExportSpec = Field(default_factory=ExportSpec, description="Hugging Face export of the trained model.")
    device_map: dict[str, list[int]] | None = Field(
        default=None,
        description="Global ranks of each role. Written by the operator; computed from roles when unset.",
    )
    progress_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of /progress and /metrics on rank 0 (0: off)."
    )
    output_dir: str = Field(default="/tmp/rlkube", max_length=MAX_PATH_LEN, description="Logs and caches.")

    @model_validator(mode="after")
    def _algorithm_settings(self) -> RuntimeConfig:
        problems = algorithm_setting_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        if self.device_map is None:
            self.device_map = device_map(self.roles)
        return self
