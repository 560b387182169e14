"""CEL building blocks the rule modules of `rlkube.operator.api.validation` share.

The spec's facts that the trainer's rules read too (a section's field or its default, a role's
GPUs, the rows of a PPO/GRPO step) are spelled in the runtime's contract
(`rlkube.runtime.contract.spec_cel`), next to those rules; the facts only the operator's rules
read (the job's GPUs and pods) are spelled here.
"""

from __future__ import annotations

from rlkube.runtime.contract.rule import cel_entry as rule
from rlkube.runtime.contract.spec import ROLE_NAMES
from rlkube.runtime.contract.spec_cel import role_gpus

__all__ = ["gpus_per_pod", "rule", "total_gpus"]


def total_gpus() -> str:
    """CEL on the spec: the sum of the roles' own gpus."""
    return "(" + " + ".join(role_gpus(name) for name in ROLE_NAMES) + ")"


def gpus_per_pod() -> str:
    return "(has(self.placement) && has(self.placement.gpusPerPod) ? self.placement.gpusPerPod : 1)"
