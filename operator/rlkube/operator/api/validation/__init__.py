"""The rules across a whole RLTrainingJob spec, and `spec_problems`, which its validator runs.

Two doors lead to a cluster, `rlkube validate` (and the operator, which parses every job with the
same pydantic types) and the API server (the CRD's schema and its CEL rules,
`x-kubernetes-validations`). Both read the same rules, so a manifest gets one verdict:
tests/unit/test_corpus_verdicts.py runs tests/data/bad and tests/data/good through both (the API
server modelled by tests/unit/crd_checker.py) and through the trainer's own config,
tests/integration/test_corpus_admission.py through a real kube-apiserver.

A rule has a Python half and, where the API server can check it, a CEL half with the same field
path at the start of its message, written side by side. Where both halves sit on one object they
are one `Rule` (message, CEL, and the Python check as `broken`; `rlkube.runtime.contract.rule`), so
they cannot drift. Each rule is written once, beside the model it guards:

- a section of the run (model, roles, data, batching, ...): its module in the runtime's contract
  (`rlkube.runtime.contract.sections`), which the trainer runs too;
- across the run's sections (roles per algorithm, KL, GRPO groups, batch splits, vocab_size,
  synthetic data's size): `rlkube.runtime.contract.algorithm_settings`, run by `RunSections`;
- a section only the operator reads: its module in `rlkube.operator.api` (`elastic_spec`,
  `run_policy_spec`, `pod_spec`, `volume_spec`);
- across the job: this package, by concept:
  - `roles`: the roles' GPUs make whole pods
  - `elastic`: the elastic range holds the job's size, and every size's mini-batch split
  - `paths`: absolute paths in the pod, normal forms, mounts the pod keeps for itself
  - `metadata`: label and annotation keys and values, which the API server checks itself before
    any schema (Python only: a CRD can add no rule to metadata)

`rlkube.operator.api.crd_rules` says on which object of the CRD each CEL rule goes.

Adding a rule: a `Rule` in the contract when the trainer must apply it too (run by the model's
validator, or listed in `algorithm_settings.SPEC_RULES`), else beside the operator's model it
guards, or for a rule across the job in the module of its concept here (a function returning
'path: what would be valid' lines called from `spec_problems` below, with its CEL written with
`cel.rule(...)`, message starting with the same path); add its CEL to `crd_rules`' `MODEL_RULES`
or `FIELD_RULES`; add a manifest to tests/data/bad whose first line is '# expect: spec.<path>';
then `make crds chart-crds`. tests/unit/test_contract_rules.py checks each contract rule's two
halves against each other, tests/unit/test_validation_rules.py the operator's.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator.api.validation import elastic, paths, roles
from rlkube.runtime.contract import model_types


def spec_problems(spec: Any) -> list[str]:
    """The Python halves of the rules across a validated `RLTrainingJobSpec`, one 'path: what is
    wrong' line each (called by its model validator, after the rules across the run's sections)."""
    return [
        *paths.mount_path_problems(spec.checkpoint.dir, spec.export.dir, [v.mount_path for v in spec.volumes],
                                   spec.checkpoint.compile_cache_dir),
        *paths.path_problems(spec.checkpoint.dir, spec.export.dir, spec.checkpoint.compile_cache_dir),
        *model_types.model_type_problems(spec),
        *paths.source_path_problems(spec),
        *elastic.elastic_split_problems(spec),
        *roles.spec_roles_problems(spec),
        *elastic.elastic_range_problems(spec),
    ]
