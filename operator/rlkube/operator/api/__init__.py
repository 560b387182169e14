"""The `RLTrainingJob` API (group rlkube.io, version v1alpha1): pydantic v2 types.

The spec embeds the runtime's own config sections (`rlkube.runtime.contract.config`: model, roles, data,
batching, training, rollout, checkpoint) unchanged, so every such field is described, bounded and
validated in one place, and adds what only the operator needs: placement, elasticity, run policy
and the pod template knobs (image, resources, node selection).

These types are the single source of the CRD (`rlkube.operator.api.crd` generates
`crds/rlkube.io_rltrainingjobs.yaml` from them) and of `rlkube validate`. Cross-field rules live
in model validators (`spec_types`); the CRD carries the same rules as CEL so the API server
enforces them at admission too.

Parsing is strict (`parse_spec`, `parse_job`): a string where a number belongs is an error, as it
is for the API server, and only the camelCase wire names are accepted.

The types live in this package's modules, named after what they hold, and this module
re-exports them so that `from rlkube.operator.api import ...` and `api.X` keep one address for
the whole API: `limits` (group, version, kind, name and field limits), `spec_types` (the spec),
`status_types` (the status), `field_errors` (errors as a user reads them) and `validation` (every
rule of the spec). Beside them: `observed` (read-only views of the API objects the operator
reads) and `crd` (the CRD generated from these types). The API package is the operator's lowest
layer: it imports nothing else of the operator.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from rlkube.operator.api.elastic_spec import ElasticSpec
from rlkube.operator.api.field_errors import FieldError, describe_error, field_errors
from rlkube.operator.api.limits import (
    API_VERSION,
    DEFAULT_TOPOLOGY_KEYS,
    DNS_LABEL_MAX,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    GROUP,
    JOB_NAME_PATTERN,
    KIND,
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    LIST_KIND,
    MAX_GPUS_PER_POD,
    MAX_JOB_NAME_LEN,
    MAX_POD_INDEX_DIGITS,
    MAX_PODS,
    MAX_SLOT_NAME_LEN,
    MAX_TOTAL_GPUS,
    PLURAL,
    QUANTITY_MAX_LEN,
    QUANTITY_PATTERN,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    job_name_problem,
)
from rlkube.operator.api.placement_spec import PlacementSpec
from rlkube.operator.api.pod_spec import PodResources, PodSecurity, ResourceList, Toleration
from rlkube.operator.api.run_policy_spec import RunPolicySpec
from rlkube.operator.api.spec_types import RLTrainingJobSpec
from rlkube.operator.api.status_types import (
    PHASES,
    Condition,
    ModelOutputStatus,
    OutputsStatus,
    Phase,
    PlacementStatus,
    PodPlacementStatus,
    ProgressStatus,
    RLTrainingJobStatus,
    RoleStatus,
    Status,
)
from rlkube.operator.api.validation.metadata import annotation_problems, label_problems
from rlkube.operator.api.volume_spec import VolumeSpec
from rlkube.runtime.contract.config import ROLE_NAMES

__all__ = [
    "API_VERSION", "DEFAULT_TOPOLOGY_KEYS", "DNS_LABEL_MAX", "DNS_LABEL_PATTERN", "DNS_SUBDOMAIN_PATTERN",
    "GROUP", "JOB_NAME_PATTERN", "KIND", "LABEL_KEY_MAX", "LABEL_KEY_PATTERN", "LABEL_VALUE_MAX",
    "LABEL_VALUE_PATTERN", "LIST_KIND", "MAX_GPUS_PER_POD", "MAX_JOB_NAME_LEN", "MAX_POD_INDEX_DIGITS",
    "MAX_PODS", "MAX_SLOT_NAME_LEN", "MAX_TOTAL_GPUS", "PHASES", "PLURAL", "QUANTITY_MAX_LEN",
    "QUANTITY_PATTERN", "ROLE_NAMES", "SHORT_NAMES", "SINGULAR", "VERSION",
    "Condition", "ElasticSpec", "FieldError", "ModelOutputStatus", "ObjectMeta", "OutputsStatus", "Phase", "PlacementSpec", "PlacementStatus",
    "PodPlacementStatus", "PodResources", "PodSecurity", "ProgressStatus", "ResourceList", "RLTrainingJob",
    "RLTrainingJobSpec", "RLTrainingJobStatus", "RoleStatus", "RunPolicySpec", "Status", "Toleration",
    "VolumeSpec",
    "describe_error", "drop_nulls", "field_errors", "job_errors", "job_name_problem",
    "parse_job", "parse_spec", "spec_errors",
]


# ---------------------------------------------------------------------------------------------
# The whole object (what `rlkube validate` reads)
# ---------------------------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The parts of metadata rlkube reads; others (uid, resourceVersion, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(
        max_length=DNS_LABEL_MAX,
        description=f"Job name: a DNS-1035 label of at most {MAX_JOB_NAME_LEN} characters, so that "
        "'<job>-<slot>-<index>' pod names stay valid hostnames.",
    )
    namespace: str | None = Field(
        default=None, max_length=DNS_LABEL_MAX, pattern=DNS_LABEL_PATTERN, description="Namespace."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")

    @field_validator("name")
    @classmethod
    def _derived_names_fit(cls, name: str) -> str:
        problem = job_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name

    @field_validator("labels", "annotations")
    @classmethod
    def _keys_and_values(cls, entries: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        # The API server refuses these itself, before any schema (rlkube.operator.api.validation.metadata).
        problems = (label_problems if info.field_name == "labels" else annotation_problems)(entries)
        if problems:
            raise ValueError("\n".join(problems))
        return entries


class RLTrainingJob(BaseModel):
    """An RLTrainingJob object as written in a manifest."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["rlkube.io/v1alpha1"] = Field(alias="apiVersion", description="API version.")
    kind: Literal["RLTrainingJob"] = Field(description="Kind.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: RLTrainingJobSpec = Field(description="Desired state.")
    status: dict[str, Any] | None = Field(default=None, description="Observed state (ignored here).")


# ---------------------------------------------------------------------------------------------
# Parsing and error reporting
# ---------------------------------------------------------------------------------------------


def parse_spec(data: Any) -> RLTrainingJobSpec:
    """Validate a spec (camelCase dict, as the API server stores it). Raises ValidationError."""
    return RLTrainingJobSpec.model_validate(drop_nulls(data), strict=True, by_alias=True, by_name=False)


def parse_job(data: Any) -> RLTrainingJob:
    """Validate a whole RLTrainingJob object (a manifest document). Raises ValidationError."""
    return RLTrainingJob.model_validate(drop_nulls(data), strict=True, by_alias=True, by_name=False)


def drop_nulls(data: Any) -> Any:
    """`data` without null-valued fields, as the API server stores it.

    The API server prunes a null given for a field whose schema is not nullable (none of ours
    is) and then applies the field's default, so `placement: null` means "the default
    placement". Free-form objects (model.config) keep their nulls, as the server does.
    """
    if isinstance(data, dict):
        return {
            key: value if key == "config" and isinstance(value, dict) else drop_nulls(value)
            for key, value in data.items()
            if value is not None
        }
    if isinstance(data, list):
        return [drop_nulls(item) for item in data]
    return data


def spec_errors(data: Any) -> list[FieldError]:
    """Every error of a spec, paths starting with 'spec.'; empty when the spec is valid."""
    try:
        parse_spec(data)
    except ValidationError as exc:
        return field_errors(exc, prefix=("spec",), model=RLTrainingJobSpec)
    return []


def job_errors(data: Any) -> list[FieldError]:
    """Every error of a whole object; empty when it is valid."""
    try:
        parse_job(data)
    except ValidationError as exc:
        return field_errors(exc, model=RLTrainingJob)
    return []

