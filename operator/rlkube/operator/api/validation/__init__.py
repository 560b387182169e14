"""Validation of an RLTrainingJob spec: the one place its rules are written.

Two doors lead to a cluster, `rlkube validate` (and the operator, which parses every job with the
same pydantic types) and the API server (the CRD's schema and its CEL rules,
`x-kubernetes-validations`). Both read their rules from this package (and through it from the
runtime's contract), so a manifest gets one verdict: tests/unit/test_corpus_verdicts.py runs
tests/data/bad and tests/data/good through both (the API server modelled by
tests/unit/crd_checker.py) and through the trainer's own config, tests/integration/
test_corpus_admission.py through a real kube-apiserver.

A rule has a Python half and, where the API server can check it, a CEL half with the same field
path at the start of its message. Where both halves sit on one object they are one `Rule`
(message, CEL, and the Python check as `broken`; `rlkube.runtime.contract.rule`), so they cannot
drift; the spec-wide rules of the operator keep a Python function and a CEL builder side by side,
sharing their message text.

The rules the trainer applies to its own config too are written once, as `Rule`s, in the
runtime's contract (the runtime never imports the operator; the operator may import the
contract): a section's own rules (`contract.sections`: one model source, gpus or colocateWith, the
micro-batch bounds, one eval source), the roles (`contract.role_rules`: the actor's GPUs,
colocation chains, adapters and functions, the reward's source), what an algorithm takes and
cannot honour (`contract.algorithm_settings`: roles per algorithm, KL, GRPO groups, sequence
lengths, synthetic data's samples per step (`contract.data_size`), batch splits over ranks and
mini-batches, decodeRows, the DPO-only fields, a model config's vocab_size against the byte
tokenizer (`contract.vocab`)) and the model types (`contract.model_types`, whose CEL twin is the
enum declared in the CRD). The trainer runs
their Python half; this package puts their CEL into the CRD (`MODEL_RULES` below).

The operator's own rule modules:

- `roles`: the roles' GPUs make whole pods
- `elastic`: the elastic range and every size's mini-batch split
- `paths`: absolute paths in the pod, normal forms, mounts and volume names the pod keeps for itself
- `pod`: requests within limits, label keys, tolerations, the security context
- `sections`: rules inside the operator's sections (elastic, run policy), integers, immutability,
  and the model config's declared schema
- `metadata`: label and annotation keys and values, which the API server checks itself before any
  schema (Python only: a CRD can add no rule to metadata)

Adding a rule: a `Rule` in the contract when the trainer must apply it too (run by the model's
validator, or listed in `algorithm_settings.SPEC_RULES`), else in the rule module of its concept
here (a `Rule`, or a function returning 'path: what would be valid' lines called from
`spec_problems` below with its CEL written with `cel.rule(...)`, message starting with the same
path); add it to `MODEL_RULES` or `FIELD_RULES` below; add a manifest to tests/data/bad whose first
line is '# expect: spec.<path>'; then `make crds chart-crds`. tests/unit/test_contract_rules.py
checks each contract rule's two halves against each other.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator.api.validation import elastic, paths, pod, roles, rule, sections
from rlkube.runtime.contract import algorithm_settings, config, model_types
from rlkube.runtime.contract.sections import roles_spec

# CEL rules on the object of a pydantic model (they follow the model wherever the CRD generator
# inlines it), by model name.
MODEL_RULES: dict[str, list[dict]] = {
    "ModelSpec": [*rule.crd(config.MODEL_SOURCE), *paths.MODEL_PATH_CEL],
    "RoleSpec": rule.crd(config.ROLE_SOURCE),
    "RolesSpec": rule.crd(roles_spec.ROLES_RULES),
    "BatchingSpec": rule.crd(config.MICRO_BATCH_BOUNDS),
    "DataSpec": [*rule.crd(config.EVAL_SOURCE), *paths.DATA_PATH_CEL],
    "ElasticSpec": rule.crd(sections.ELASTIC),
    "VolumeSpec": paths.volume_cel(),
    "CheckpointSpec": [*paths.dir_cel("checkpoint.dir"), *paths.dir_cel("checkpoint.compileCacheDir", "compileCacheDir")],
    "ExportSpec": paths.dir_cel("export.dir"),
    "Toleration": rule.crd(pod.TOLERATION),
    "PodResources": rule.crd(pod.RESOURCES),
    "PodSecurity": rule.crd(pod.SECURITY),
    "RLTrainingJobSpec": [
        *roles.spec_roles_cel(),
        *rule.crd(algorithm_settings.SPEC_RULES),
        *elastic.elastic_cel(),
        *paths.mount_path_cel(),
    ],
}

# CEL rules on one property, by (model name, wire field name).
FIELD_RULES: dict[tuple[str, str], list[dict]] = {
    ("RLTrainingJobSpec", "algorithm"): sections.immutable("algorithm"),
    ("RLTrainingJobSpec", "model"): sections.immutable("model"),
    ("RLTrainingJobSpec", "roles"): sections.immutable("roles"),
    ("RLTrainingJobSpec", "volumes"): paths.VOLUMES_CEL,
    ("RLTrainingJobSpec", "nodeSelector"): pod.NODE_SELECTOR_CEL,
    ("RunPolicySpec", "failOnExitCodes"): sections.FAIL_ON_EXIT_CODES_CEL,
}

# Schema added to a property as the generator writes it (declared fields of a free-form object).
FIELD_SCHEMAS: dict[tuple[str, str], dict] = {("ModelSpec", "config"): sections.MODEL_CONFIG_SCHEMA}

# CEL rules on every property of a JSON type in the spec.
TYPE_RULES: dict[str, list[dict]] = {"integer": sections.INTEGER_CEL}

# Volumes are keyed by name (unique names, merge-friendly).
LIST_MAP_KEYS: dict[tuple[str, str], list[str]] = {("RLTrainingJobSpec", "volumes"): ["name"]}


def spec_problems(spec: Any) -> list[str]:
    """The Python halves of this package's spec-wide rules on a validated `RLTrainingJobSpec`,
    one 'path: what is wrong' line each (called by its model validator)."""
    return [
        *paths.mount_path_problems(spec.checkpoint.dir, spec.export.dir, [v.mount_path for v in spec.volumes],
                                   spec.checkpoint.compile_cache_dir),
        *paths.path_problems(spec.checkpoint.dir, spec.export.dir, spec.checkpoint.compile_cache_dir),
        *model_types.model_type_problems(spec),
        *paths.source_path_problems(spec),
        *elastic.elastic_split_problems(spec),
    ]
