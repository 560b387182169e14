"""Rules on the roles that only the operator applies: the roles' GPUs add up to whole pods.

The rules the trainer applies too (the actor's GPUs, colocation chains, which role takes a
function or adapters, the reward role's source, which roles an algorithm takes, a colocated
critic's mini-batch split) are written once in the runtime's contract
(`rlkube.runtime.contract.role_rules`, `rlkube.runtime.contract.algorithm_settings`), Python and
CEL together; `rlkube.operator.api.validation` puts their CEL into the CRD.
"""

from __future__ import annotations

from rlkube.operator.api.validation.cel import gpus_per_pod, rule, total_gpus


def spec_roles_cel() -> list[dict]:
    """CEL on the spec: the roles' GPU sum and gpusPerPod (RLTrainingJobSpec._cross_field's twins)."""
    total, per_pod = total_gpus(), gpus_per_pod()
    return [
        rule(f"{total} >= 1", "roles: the roles' gpus must add up to >= 1", ".roles"),
        # gpusPerPod < 1 is refused by its own minimum; the guard keeps CEL from dividing by 0.
        rule(f"{per_pod} < 1 || {total} % {per_pod} == 0",
             "placement.gpusPerPod: the job's total GPUs (the sum of the roles' gpus) must be a "
             "multiple of gpusPerPod", ".placement"),
    ]
