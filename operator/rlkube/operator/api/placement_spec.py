"""`placement`: how the job's GPUs are packed into pods and which topology domains hold each
role's device group (planning/placement.py plans by it). Only the operator reads it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from rlkube.operator.api.limits import (
    DEFAULT_TOPOLOGY_KEYS,
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    MAX_GPUS_PER_POD,
)
from rlkube.runtime.contract.spec import Spec, repeated


class PlacementSpec(Spec):
    """How the job's GPUs are packed into pods and which topology domains hold each role's group."""

    gpus_per_pod: int = Field(
        default=1, ge=1, le=MAX_GPUS_PER_POD,
        description="GPUs (and trainer processes) per pod; one pod per node slot. The job's total "
        "GPUs must be a multiple of it. Set it to the GPUs of one node (say 8) so a role's group "
        "shares NVLink inside one pod.",
    )
    topology_keys: list[Annotated[str, Field(max_length=LABEL_KEY_MAX, pattern=LABEL_KEY_PATTERN)]] = (
        Field(
            default_factory=lambda: list(DEFAULT_TOPOLOGY_KEYS),
            min_length=1,
            max_length=8,
            description="Node label keys of topology domains, tightest first (NVLink clique, node, "
            "rack, zone). Each role's device group is placed inside the tightest domain that can "
            "hold it.",
            json_schema_extra={"x-kubernetes-list-type": "set"},
        )
    )
    policy: Literal["required", "preferred"] = Field(
        default="preferred",
        description="'required': pods stay gated until every role's group fits inside one domain "
        "of some topology key. 'preferred': the tightest placement found is used, and a group that "
        "has to span domains is reported in an Event.",
    )
    gang_timeout_seconds: int = Field(
        default=600, ge=1, le=604_800,
        description="How long the whole gang may wait for GPUs to be placed before the job fails "
        "with reason Unschedulable.",
    )

    @field_validator("topology_keys")
    @classmethod
    def _unique_keys(cls, keys: list[str]) -> list[str]:
        if duplicates := repeated(keys):
            raise ValueError(f"must not repeat a key, got {', '.join(duplicates)} more than once")
        return keys
