"""Where the CRD generator (`crd`) puts each rule's CEL, and the schema it adds to fields.

Each rule is written once beside the model it guards: a section of the run in the runtime's
contract (`rlkube.runtime.contract.sections`), a section only the operator reads in its module
here (`elastic_spec`, `run_policy_spec`, `pod_spec`, `volume_spec`), a rule across sections in
the contract's `algorithm_settings` and one across the job in `validation`. These tables say on
which object of the schema each CEL rule goes; the rules that belong to no one model (every
integer, the immutable fields, the model config's declared fields) are written here.
"""

from __future__ import annotations

from rlkube.operator.api.elastic_spec import ELASTIC
from rlkube.operator.api.pod_spec import NODE_SELECTOR_CEL, RESOURCES, SECURITY, TOLERATION
from rlkube.operator.api.run_policy_spec import FAIL_ON_EXIT_CODES_CEL
from rlkube.operator.api.validation import elastic, paths, roles
from rlkube.operator.api.volume_spec import VOLUMES_CEL, volume_cel
from rlkube.runtime.contract import algorithm_settings
from rlkube.runtime.contract.model_types import SUPPORTED_MODEL_TYPES
from rlkube.runtime.contract.rule import cel_entry as rule
from rlkube.runtime.contract.rule import crd as crd_entries
from rlkube.runtime.contract.sections import (
    EVAL_SOURCE,
    MICRO_BATCH_BOUNDS,
    MODEL_SOURCE,
    REPORT_TO_RULES,
    ROLE_SOURCE,
    ROLES_RULES,
)
from rlkube.runtime.contract.sections.environment_spec import ENVIRONMENT_FIELDS_IMMUTABLE
from rlkube.runtime.contract.spec import ROLE_NAMES
from rlkube.runtime.contract.vocab import BYTE_TOKENIZER, BYTE_VOCAB_SIZE, VOCAB_SIZE

# On every integer field of the spec. The API server's schema check takes a float with no
# fractional part (2.0) for an integer, but its CEL then fails on it ("expected int, got float64")
# wherever a rule reads the field, and pydantic (strict) refuses it everywhere; reading the value
# in a rule on the field itself refuses it everywhere too, naming the field.
INTEGER_CEL = [rule("self == self", "must be an integer (not a float such as 2.0)")]


def immutable(field: str) -> list[dict]:
    return [rule("self == oldSelf", f"{field} is immutable: it defines the run; create a new RLTrainingJob instead")]


def roles_immutable() -> list[dict]:
    """The roles are immutable but for the environment's replicas (scaling it on a running job): the
    GPU roles and whether there is an environment are compared here, the environment's other
    fields each by its own rule (`FIELD_RULES`)."""
    same = ["self.actor == oldSelf.actor", "has(self.environment) == has(oldSelf.environment)"]
    same += [f"has(self.{name}) == has(oldSelf.{name}) && (!has(self.{name}) || self.{name} == oldSelf.{name})"
             for name in ROLE_NAMES if name != "actor"]
    return [rule(" && ".join(f"({each})" for each in same),
                 "roles is immutable except roles.environment.replicas: it defines the run; create a new "
                 "RLTrainingJob instead")]


# -- model types ----------------------------------------------------------------------------------
# The Python half is the contract's `model_types.model_type_problems` (the trainer runs it too).

# Declared inside the free-form model config, so the API server checks it (it cannot look at an
# undeclared field).
MODEL_CONFIG_SCHEMA = {
    "required": ["model_type"],
    "properties": {
        "model_type": {
            "type": "string",
            "description": "The model family, as in config.json; one rlkube trains.",
            "enum": list(SUPPORTED_MODEL_TYPES),
            "maxLength": max(map(len, SUPPORTED_MODEL_TYPES)),
        },
        # Declared so the spec's rules can read it (contract.vocab.VOCAB_RULES); the Python half of
        # the type and bound is ModelSpec's validator (contract.vocab.vocab_size_problem).
        VOCAB_SIZE: {
            "type": "integer",
            "description": "Size of the model's vocabulary (its embedding rows), as in config.json. "
            f"With model.tokenizer '{BYTE_TOKENIZER}', at least {BYTE_VOCAB_SIZE}.",
            "minimum": 1,
            "x-kubernetes-validations": INTEGER_CEL,
        },
    },
}


# CEL rules on the object of a pydantic model (they follow the model wherever the CRD generator
# inlines it), by model name.
MODEL_RULES: dict[str, list[dict]] = {
    "ModelSpec": [*crd_entries(MODEL_SOURCE), *paths.MODEL_PATH_CEL],
    "RoleSpec": crd_entries(ROLE_SOURCE),
    "RolesSpec": crd_entries(ROLES_RULES),
    "BatchingSpec": crd_entries(MICRO_BATCH_BOUNDS),
    "TrainingSpec": crd_entries(REPORT_TO_RULES),
    "DataSpec": [*crd_entries(EVAL_SOURCE), *paths.DATA_PATH_CEL],
    "ElasticSpec": crd_entries(ELASTIC),
    "VolumeSpec": volume_cel(),
    "CheckpointSpec": [*paths.dir_cel("checkpoint.dir"), *paths.dir_cel("checkpoint.compileCacheDir", "compileCacheDir")],
    "ExportSpec": paths.dir_cel("export.dir"),
    "Toleration": crd_entries(TOLERATION),
    "PodResources": crd_entries(RESOURCES),
    "PodSecurity": crd_entries(SECURITY),
    "RLTrainingJobSpec": [
        *roles.spec_roles_cel(),
        *crd_entries(algorithm_settings.SPEC_RULES),
        *elastic.elastic_cel(),
        *paths.mount_path_cel(),
    ],
}

# CEL rules on one property, by (model name, wire field name).
FIELD_RULES: dict[tuple[str, str], list[dict]] = {
    ("RLTrainingJobSpec", "algorithm"): immutable("algorithm"),
    ("RLTrainingJobSpec", "model"): immutable("model"),
    ("RLTrainingJobSpec", "roles"): roles_immutable(),
    **{("EnvironmentSpec", wire): immutable(f"roles.environment.{wire}") for wire in ENVIRONMENT_FIELDS_IMMUTABLE},
    ("RLTrainingJobSpec", "volumes"): VOLUMES_CEL,
    ("RLTrainingJobSpec", "nodeSelector"): NODE_SELECTOR_CEL,
    ("RunPolicySpec", "failOnExitCodes"): FAIL_ON_EXIT_CODES_CEL,
}

# Schema added to a property as the generator writes it (declared fields of a free-form object).
FIELD_SCHEMAS: dict[tuple[str, str], dict] = {("ModelSpec", "config"): MODEL_CONFIG_SCHEMA}

# CEL rules on every property of a JSON type in the spec.
TYPE_RULES: dict[str, list[dict]] = {"integer": INTEGER_CEL}

# Volumes are keyed by name (unique names, merge-friendly).
LIST_MAP_KEYS: dict[tuple[str, str], list[str]] = {("RLTrainingJobSpec", "volumes"): ["name"]}
