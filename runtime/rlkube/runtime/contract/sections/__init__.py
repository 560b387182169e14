"""The sections of a run's spec, a module each, every section with its own rules beside it:
`model_spec` (and LoRA), `roles_spec` (the roles, their rules and `device_map`), `environment_spec`
(the environment service of `roles.environment`), `data_spec`,
`batching_spec`, `training_spec`, `rollout_spec`, `checkpoint_spec` and `export_spec`.

`contract.config` puts them together into `RunSections`, the one declaration of the sections
that the runtime's `RuntimeConfig` and the operator's `RLTrainingJobSpec` both derive from, and is
where the rest of the code imports them from; the rules across sections (`algorithm_settings`,
`data_size`, `vocab`) import them from here. Field names are snake_case in Python and camelCase on
the wire (YAML, the CRD); unknown fields are errors. Torch-free: the operator imports them.
"""

from __future__ import annotations

from rlkube.runtime.contract.sections.batching_spec import MICRO_BATCH_BOUNDS, BatchingSpec
from rlkube.runtime.contract.sections.checkpoint_spec import CheckpointSpec
from rlkube.runtime.contract.sections.data_spec import EVAL_SOURCE, DataFields, DataSpec
from rlkube.runtime.contract.sections.environment_spec import ENVIRONMENT_RULES, EnvironmentSpec
from rlkube.runtime.contract.sections.export_spec import ExportSpec
from rlkube.runtime.contract.sections.model_spec import MODEL_SOURCE, LoraSpec, ModelSpec
from rlkube.runtime.contract.sections.roles_spec import (
    ROLE_SOURCE,
    ROLES_RULES,
    RoleSpec,
    RolesSpec,
    device_map,
)
from rlkube.runtime.contract.sections.rollout_spec import RolloutSpec, ToolsSpec
from rlkube.runtime.contract.sections.training_spec import REPORT_TO_RULES, TRACKER_NAMES, TrainingSpec

__all__ = [
    "ENVIRONMENT_RULES", "EVAL_SOURCE", "EnvironmentSpec", "MICRO_BATCH_BOUNDS", "MODEL_SOURCE", "REPORT_TO_RULES",
    "ROLES_RULES", "ROLE_SOURCE", "TRACKER_NAMES", "BatchingSpec",
    "CheckpointSpec", "DataFields", "DataSpec", "ExportSpec", "LoraSpec", "ModelSpec", "RoleSpec", "RolesSpec",
    "RolloutSpec", "ToolsSpec", "TrainingSpec", "device_map",
]
