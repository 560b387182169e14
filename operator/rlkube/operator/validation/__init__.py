"""Validation of an RLTrainingJob spec: the one place its rules are written.

Two doors lead to a cluster, `rlkube validate` (and the operator, which parses every job with the
same pydantic types) and the API server (the CRD's schema and its CEL rules,
`x-kubernetes-validations`). Both read their rules from this package, so a manifest gets one
verdict: tests/unit/test_corpus_verdicts.py runs tests/data/bad and tests/data/good through both
(the API server modelled by tests/unit/crd_checker.py), tests/integration/test_corpus_admission.py
through a real kube-apiserver.

A rule has a Python half and, where the API server can check it, a CEL half with the same field
path at the start of its message. The rule modules hold both halves side by side:

- `roles`: which roles an algorithm takes, colocation, GPU sums, a colocated critic's split
- `settings`: what the algorithm cannot honour (the CEL of runtime/contract/algorithm_settings.py)
- `elastic`: the elastic range and every size's mini-batch split
- `paths`: absolute paths in the pod, normal forms, mounts and volume names the pod keeps for itself
- `pod`: requests within limits, label keys, tolerations, the security context
- `sections`: rules inside one section (exactly one model source, ...) and the model types
- `metadata`: label and annotation keys and values, which the API server checks itself before any
  schema (Python only: a CRD can add no rule to metadata)

Where a rule's two halves sit on the same object they are one `rule.Rule` (message, CEL, and the
Python check as `broken`), and the section's validator runs it (`rule.check`); the spec-wide
rules keep a Python function and a CEL builder side by side, sharing their message text.

The rules the trainer also applies to its own config (roles, algorithm settings, a section's own
validator) have their Python half in `rlkube.runtime.contract` (the runtime never imports the
operator); their CEL is here, next to a docstring naming the Python half.

Adding a rule: write its Python check in the rule module of its concept (or in the runtime's
contract when the trainer must apply it too), returning 'path: what would be valid' lines; call it
from the `problems` function below (or the model's validator); write its CEL with `cel.rule(...)`
in the same module, message starting with the same path; add it to `MODEL_RULES` or `FIELD_RULES`
below; add a manifest to tests/data/bad whose first line is '# expect: spec.<path>'; then
`make crds chart-crds`.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator.validation import elastic, paths, pod, roles, rule, sections, settings

# CEL rules on the object of a pydantic model (they follow the model wherever the CRD generator
# inlines it), by model name.
MODEL_RULES: dict[str, list[dict]] = {
    "ModelSpec": [*sections.MODEL_CEL, *paths.MODEL_PATH_CEL],
    "RoleSpec": sections.ROLE_CEL,
    "RolesSpec": roles.roles_cel(),
    "BatchingSpec": sections.BATCHING_CEL,
    "DataSpec": [*sections.DATA_CEL, *paths.DATA_PATH_CEL],
    "ElasticSpec": rule.crd(sections.ELASTIC),
    "VolumeSpec": paths.volume_cel(),
    "CheckpointSpec": paths.dir_cel("checkpoint.dir"),
    "ExportSpec": paths.dir_cel("export.dir"),
    "Toleration": rule.crd(pod.TOLERATION),
    "PodResources": rule.crd(pod.RESOURCES),
    "PodSecurity": rule.crd(pod.SECURITY),
    "RLTrainingJobSpec": [
        *roles.spec_roles_cel(),
        roles.colocated_critic_cel(),
        *elastic.elastic_cel(),
        *settings.algorithm_settings_cel(),
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
        *paths.mount_path_problems(spec.checkpoint.dir, spec.export.dir, [v.mount_path for v in spec.volumes]),
        *paths.path_problems(spec.checkpoint.dir, spec.export.dir),
        *sections.model_type_problems(spec),
        *paths.source_path_problems(spec),
        *roles.colocated_critic_problems(spec),
        *elastic.elastic_split_problems(spec),
    ]
