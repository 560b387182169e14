"""Rules on the roles that only the operator applies: the roles' GPUs add up to whole pods, Python
and CEL side by side.

The rules the trainer applies too (the actor's GPUs, colocation chains, which role takes a
function or adapters, the reward role's source, which roles an algorithm takes, a colocated
critic's mini-batch split) are written once in the runtime's contract
(`rlkube.runtime.contract.sections.roles_spec`, `rlkube.runtime.contract.algorithm_settings`), Python and
CEL together; `rlkube.operator.api.validation` puts their CEL into the CRD.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator.api.limits import MAX_GPUS_PER_POD, MAX_PODS
from rlkube.operator.api.validation.cel import gpus_per_pod, rule, total_gpus


def spec_roles_problems(spec: Any) -> list[str]:
    """The roles' GPUs add up to at least one, and to whole pods of gpusPerPod, at most MAX_PODS."""
    problems = []
    total = spec.total_gpus()
    if total < 1:
        problems.append(f"roles: the roles' gpus must add up to >= 1, got {total}")
    per_pod = spec.placement.gpus_per_pod
    if total % per_pod:
        divisors = [d for d in range(1, min(total, MAX_GPUS_PER_POD) + 1) if total % d == 0]
        summary = ", ".join(f"{name} {role.gpus}" for name, role in spec.roles.present().items() if role.gpus)
        problems.append(
            f"placement.gpusPerPod: the job's {total} GPUs ({summary}) are not a "
            f"multiple of gpusPerPod {per_pod}; use one of {divisors} or change the roles' gpus"
        )
    elif total // per_pod > MAX_PODS:
        problems.append(f"placement.gpusPerPod: {total // per_pod} pods, at most {MAX_PODS} allowed")
    return problems


def spec_roles_cel() -> list[dict]:
    """CEL on the spec: the roles' GPU sum and gpusPerPod (`spec_roles_problems`' twins)."""
    total, per_pod = total_gpus(), gpus_per_pod()
    return [
        rule(f"{total} >= 1", "roles: the roles' gpus must add up to >= 1", ".roles"),
        # gpusPerPod < 1 is refused by its own minimum; the guard keeps CEL from dividing by 0.
        rule(f"{per_pod} < 1 || {total} % {per_pod} == 0",
             "placement.gpusPerPod: the job's total GPUs (the sum of the roles' gpus) must be a "
             "multiple of gpusPerPod", ".placement"),
    ]
