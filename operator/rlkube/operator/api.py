"""The `RLTrainingJob` API (group rlkube.io, version v1alpha1): pydantic v2 types.

The spec embeds the runtime's own config sections (`rlkube.runtime.contract.config`: model, roles, data,
batching, training, rollout, checkpoint) unchanged, so every such field is described, bounded and
validated in one place, and adds what only the operator needs: placement, elasticity, run policy
and the pod template knobs (image, resources, node selection).

These types are the single source of the CRD (`rlkube.operator.crd` generates
`crds/rlkube.io_rltrainingjobs.yaml` from them) and of `rlkube validate`. Cross-field rules live
in model validators here; the CRD carries the same rules as CEL so the API server enforces them
at admission too.

Parsing is strict (`parse_spec`, `parse_job`): a string where a number belongs is an error, as it
is for the API server, and only the camelCase wire names are accepted.

Derived names: the job's pods are named `<job>-<slot>-<index>` and its headless Service `<job>`.
A pod's name is also its hostname under that Service, so it must be a DNS-1123 label (at most 63
characters). With slot names of at most 9 characters ("reference") and pod indexes of at most 5
digits (a job has at most 4 * 4096 GPUs), a job name of at most 40 characters leaves
63 - 40 - 1 - 9 - 1 - 5 = 7 characters spare for a restart-attempt suffix. The Service name must
be a DNS-1035 label, so the job name starts with a letter.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from rlkube.runtime.contract.config import (
    MAX_NAME_LEN,
    MAX_PATH_LEN,
    ROLE_NAMES,
    BatchingSpec,
    CheckpointSpec,
    DataSpec,
    ModelSpec,
    RoleSpec,
    RolesSpec,
    RolloutSpec,
    RuntimeConfig,
    Spec,
    TrainingSpec,
    device_map,
    validate_algorithm_roles,
)

GROUP = "rlkube.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLTrainingJob"
LIST_KIND = "RLTrainingJobList"
PLURAL = "rltrainingjobs"
SINGULAR = "rltrainingjob"
SHORT_NAMES = ("rltj",)

# See the module docstring for how these add up to the 63-character DNS label of a pod name.
DNS_LABEL_MAX = 63
MAX_SLOT_NAME_LEN = 9
MAX_POD_INDEX_DIGITS = 5
MAX_JOB_NAME_LEN = 40
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
assert MAX_JOB_NAME_LEN + 1 + MAX_SLOT_NAME_LEN + 1 + MAX_POD_INDEX_DIGITS <= DNS_LABEL_MAX

DEFAULT_TOPOLOGY_KEYS = (
    "nvidia.com/gpu.clique",
    "kubernetes.io/hostname",
    "rlkube.io/rack",
    "topology.kubernetes.io/zone",
)
# A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_KEY_MAX = 317  # 253 (prefix) + 1 + 63 (name)
LABEL_VALUE_MAX = 63
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Kubernetes resource quantity, e.g. 500m, 2, 1.5, 16Gi, 1e3.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$"
QUANTITY_MAX_LEN = 64
MAX_GPUS_PER_POD = 64
MAX_PODS = 16384
MAX_TOTAL_GPUS = 4 * 4096


# ---------------------------------------------------------------------------------------------
# Spec sections only the operator reads
# ---------------------------------------------------------------------------------------------


class PlacementSpec(Spec):
    """How the job's GPUs are packed into pods and which topology domains hold each role's group."""

    gpus_per_pod: int = Field(
        default=1,
        ge=1,
        le=MAX_GPUS_PER_POD,
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
        default=600,
        ge=1,
        le=604_800,
        description="How long the whole gang may wait for GPUs to be placed before the job fails "
        "with reason Unschedulable.",
    )

    @field_validator("topology_keys")
    @classmethod
    def _unique_keys(cls, keys: list[str]) -> list[str]:
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise ValueError(f"must not repeat a key, got {', '.join(duplicates)} more than once")
        return keys


class ElasticSpec(Spec):
    """Elastic size: the range of workers (pods of gpusPerPod GPUs) the job may run with.

    Each attempt is planned at the largest count in the range that fits the free GPUs; a job
    running below maxWorkers is restarted larger from its checkpoint once more GPUs are free.
    A gang that resizes across nodes needs checkpoints every node sees (checkpoint.volumeClaim
    on a ReadWriteMany volume)."""

    min_workers: int = Field(
        ge=1,
        le=MAX_PODS,
        description="Fewest pods the job keeps running with (the actor's data-parallel group "
        "shrinks; the global batch is kept by more gradient accumulation). At most the pods the "
        "roles' GPUs make.",
    )
    max_workers: int = Field(
        ge=1,
        le=MAX_PODS,
        description="Most pods the job grows to when GPUs become free. At least minWorkers and "
        "the pods the roles' GPUs make.",
    )

    @model_validator(mode="after")
    def _range(self) -> ElasticSpec:
        if self.max_workers < self.min_workers:
            raise ValueError(
                f"maxWorkers: must be >= minWorkers ({self.min_workers}), got {self.max_workers}"
            )
        return self


class RunPolicySpec(Spec):
    """What happens when pods fail, how long a job may run, and when it is cleaned up."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="Gang restarts (from the latest checkpoint) allowed after retriable failures "
        "before the job fails.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="Wall-clock seconds since the job started after which it is stopped and fails "
        "with reason DeadlineExceeded. Unset: no limit.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="Seconds after the job succeeded or failed when it is deleted (its pods with "
        "it). Unset: kept until deleted by hand.",
    )
    suspend: bool = Field(
        default=False,
        description="True: no pods run (existing ones are stopped after a checkpoint); False "
        "resumes. Queue controllers such as Kueue admit a job by setting it to false.",
    )
    fail_on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: [3, 4],
        max_length=32,
        description="Trainer exit codes that fail the job at once instead of restarting it "
        "(3: invalid config, 4: non-finite loss).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("fail_on_exit_codes")
    @classmethod
    def _unique_codes(cls, codes: list[int]) -> list[int]:
        duplicates = sorted({code for code in codes if codes.count(code) > 1})
        if duplicates:
            raise ValueError(f"must not repeat a code, got {', '.join(map(str, duplicates))} more than once")
        if 143 in codes:
            raise ValueError("must not contain 143: that code means stopped by SIGTERM after a checkpoint")
        return codes


Quantity = Annotated[str, Field(max_length=QUANTITY_MAX_LEN, pattern=QUANTITY_PATTERN)]


class ResourceList(Spec):
    """CPU and memory amounts, as Kubernetes quantities."""

    cpu: Quantity | None = Field(default=None, description="CPU cores, e.g. '500m' or '8'.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. '2Gi' or '512Mi'.")
    ephemeral_storage: Quantity | None = Field(
        default=None, description="Node-local scratch space, e.g. '10Gi'."
    )


class PodResources(Spec):
    """CPU and memory of each pod. GPUs are not set here: each pod gets placement.gpusPerPod."""

    requests: ResourceList = Field(
        default_factory=ResourceList, description="Amounts the scheduler reserves for each pod."
    )
    limits: ResourceList = Field(
        default_factory=ResourceList, description="Most each pod may use (memory: OOM-killed above)."
    )


class Toleration(Spec):
    """A pod toleration, as in the Pod API."""

    key: str | None = Field(
        default=None,
        max_length=LABEL_KEY_MAX,
        description="Taint key the toleration matches; unset with operator Exists matches all taints.",
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="How key and value match.")
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, description="Taint value (operator Equal)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect matched; unset matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=31_536_000,
        description="NoExecute only: seconds the pod stays bound after the taint appears.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("value: must be empty when operator is Exists")
        if self.key is None and self.operator != "Exists":
            raise ValueError("operator: must be Exists when key is unset")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds: only applies to effect NoExecute")
        return self


class PodSecurity(Spec):
    """Overrides of the pods' security context (the operator's default runs as non-root 1000)."""

    run_as_user: int | None = Field(default=None, ge=0, le=2**31 - 1, description="UID of the trainer process.")
    run_as_group: int | None = Field(default=None, ge=0, le=2**31 - 1, description="GID of the trainer process.")
    fs_group: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Group that owns mounted volumes (checkpoints)."
    )
    run_as_non_root: bool | None = Field(
        default=None, description="Refuse to start a container whose user is root."
    )


class VolumeSpec(Spec):
    """A volume mounted read-only or read-write into every pod (model weights, data sets)."""

    name: str = Field(
        max_length=DNS_LABEL_MAX, pattern=DNS_LABEL_PATTERN, description="Volume name (a DNS label)."
    )
    mount_path: str = Field(
        max_length=MAX_PATH_LEN, pattern=r"^/", description="Absolute path where it is mounted in the pod."
    )
    claim_name: str | None = Field(
        default=None,
        max_length=MAX_NAME_LEN,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim to mount. Exactly one of claimName and hostPath is set.",
    )
    host_path: str | None = Field(
        default=None,
        max_length=MAX_PATH_LEN,
        pattern=r"^/",
        description="Directory on the node to mount. Exactly one of claimName and hostPath is set.",
    )
    read_only: bool = Field(default=True, description="Mount read-only.")

    @model_validator(mode="after")
    def _one_source(self) -> VolumeSpec:
        if (self.claim_name is None) == (self.host_path is None):
            raise ValueError("exactly one of claimName and hostPath must be set")
        return self


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------


class RLTrainingJobSpec(Spec):
    """Desired state of an RL post-training run: what to train, on which GPUs, and how."""

    algorithm: Literal["dpo", "ppo", "grpo"] = Field(
        description="RL algorithm: dpo (preference pairs, no rollouts), ppo (critic and GAE), or "
        "grpo (group-relative advantages, no critic). Immutable."
    )
    model: ModelSpec = Field(description="The actor's model (the one being trained). Immutable.")
    roles: RolesSpec = Field(
        description="The job's roles and their device groups: each role has GPUs of its own or "
        "colocates with another role. Immutable."
    )
    data: DataSpec = Field(description="Training data (preference pairs for dpo, prompts for ppo/grpo).")
    batching: BatchingSpec = Field(default_factory=BatchingSpec, description="Batch sizing.")
    training: TrainingSpec = Field(
        default_factory=TrainingSpec, description="Optimizer and algorithm knobs."
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Generation settings (ppo, grpo).")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Packing of GPUs into pods and topology-aware placement."
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Elastic size range in pods, for jobs whose only GPUs are the actor's. Unset: "
        "the job runs with exactly the pods its roles' GPUs make.",
    )
    run_policy: RunPolicySpec = Field(
        default_factory=RunPolicySpec, description="Restarts, deadlines, suspension and clean-up."
    )
    image: str = Field(
        max_length=1024,
        pattern=r"^[^\s]+$",
        description="Container image of the rlkube runtime, e.g. 'localhost/rlkube/runtime-cpu:dev'.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="When the kubelet pulls the image."
    )
    resources: PodResources = Field(
        default_factory=PodResources, description="CPU and memory requests and limits of each pod."
    )
    node_selector: dict[
        str, Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN)]
    ] = Field(
        default_factory=dict,
        max_length=64,
        description="Node labels every pod requires (added to the placement's node affinity).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of every pod (GPU node taints, say)."
    )
    scheduler_name: str | None = Field(
        default=None,
        max_length=MAX_NAME_LEN,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Scheduler of the pods (a gang scheduler such as Volcano). Unset: the default "
        "scheduler.",
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=MAX_NAME_LEN,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of the pods. Unset: the cluster's default priority.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=MAX_NAME_LEN,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount the pods run as. Unset: the namespace's default.",
    )
    security_context: PodSecurity | None = Field(
        default=None, description="Overrides of the pods' security context."
    )
    volumes: list[VolumeSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Extra volumes mounted into every pod: model weights, data sets.",
    )

    @field_validator("volumes")
    @classmethod
    def _unique_volumes(cls, volumes: list[VolumeSpec]) -> list[VolumeSpec]:
        names = [volume.name for volume in volumes]
        paths = [volume.mount_path for volume in volumes]
        for what, values in (("name", names), ("mountPath", paths)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                raise ValueError(f"each {what} must be unique, got {', '.join(repeated)} more than once")
        if "checkpoints" in names:
            raise ValueError("name 'checkpoints' is reserved for the checkpoint volume")
        return volumes

    @model_validator(mode="after")
    def _cross_field(self) -> RLTrainingJobSpec:
        # Every problem on its own line, each starting with its path, so the user sees them all
        # at once (the error formatter splits the lines and prefixes the location).
        problems: list[str] = []
        try:
            validate_algorithm_roles(self.algorithm, self.roles)
        except ValueError as exc:
            problems.append(str(exc))
        for name, role in self.roles.present().items():
            if role.function is not None and name != "reward":
                problems.append(f"roles.{name}.function: only the reward role takes a function")
            if role.function is not None and role.model is not None:
                problems.append(f"roles.{name}: set model or function, not both")
        total = self.total_gpus()
        if total < 1:
            problems.append(f"roles: the roles' gpus must add up to >= 1, got {total}")
        per_pod = self.placement.gpus_per_pod
        if total % per_pod:
            divisors = [d for d in range(1, min(total, MAX_GPUS_PER_POD) + 1) if total % d == 0]
            problems.append(
                f"placement.gpusPerPod: the job's {total} GPUs ({self._gpu_summary()}) are not a "
                f"multiple of gpusPerPod {per_pod}; use one of {divisors} or change the roles' gpus"
            )
        elif total // per_pod > MAX_PODS:
            problems.append(f"placement.gpusPerPod: {total // per_pod} pods, at most {MAX_PODS} allowed")
        if self.elastic is not None:
            problems.extend(self._elastic_problems(total, per_pod))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _elastic_problems(self, total: int, per_pod: int) -> list[str]:
        assert self.elastic is not None
        problems = []
        if total % per_pod == 0 and self.elastic.min_workers > total // per_pod:
            problems.append(
                f"elastic.minWorkers: must be <= the job's {total // per_pod} pods "
                f"({total} GPUs / gpusPerPod {per_pod}), got {self.elastic.min_workers}"
            )
        if total % per_pod == 0 and self.elastic.max_workers < total // per_pod:
            problems.append(
                f"elastic.maxWorkers: must be >= the job's {total // per_pod} pods "
                f"({total} GPUs / gpusPerPod {per_pod}), got {self.elastic.max_workers}"
            )
        others = [name for name, role in self.roles.present().items() if name != "actor" and role.gpus]
        if others:
            problems.append(
                f"elastic: only the actor's data-parallel group resizes, so the other roles must "
                f"colocateWith the actor or have gpus: 0; {', '.join(others)} have GPUs of their own"
            )
        return problems

    # -- derived facts, used by placement, rendering and status --------------------------------

    def worker_counts(self) -> list[int]:
        """Gang sizes (pods) the job may run with, the preferred first: the pods its roles' GPUs
        make, or with `elastic` every count from maxWorkers down to minWorkers."""
        if self.elastic is None:
            return [self.pod_count()]
        return list(range(self.elastic.max_workers, self.elastic.min_workers - 1, -1))

    def with_workers(self, pods: int) -> RLTrainingJobSpec:
        """This spec at a gang size of `pods` (an elastic job): the actor gets pods x gpusPerPod
        GPUs, the only GPUs of an elastic job. globalBatch stays; the runtime spreads it over the
        ranks it finds, so only the per-rank share and the gradient accumulation change."""
        if pods == self.pod_count():
            return self
        actor = self.roles.actor.model_copy(update={"gpus": pods * self.placement.gpus_per_pod})
        return self.model_copy(update={"roles": self.roles.model_copy(update={"actor": actor})})

    def total_gpus(self) -> int:
        """GPUs of the job: the sum of the roles' own gpus (colocated roles add none)."""
        return self.roles.total_gpus()

    def pod_count(self) -> int:
        """Pods of the full-size gang (total GPUs / gpusPerPod)."""
        return self.total_gpus() // self.placement.gpus_per_pod

    def device_map(self) -> dict[str, list[int]]:
        """Global ranks of each role (see `rlkube.runtime.contract.config.device_map`)."""
        return device_map(self.roles)

    def runtime_config(self, device_map: dict[str, list[int]] | None = None) -> RuntimeConfig:
        """The trainer's config for this spec (what the operator renders into run.yaml)."""
        return RuntimeConfig(
            algorithm=self.algorithm,
            model=self.model,
            roles=self.roles,
            data=self.data,
            batching=self.batching,
            training=self.training,
            rollout=self.rollout,
            checkpoint=self.checkpoint,
            device_map=device_map if device_map is not None else self.device_map(),
        )

    def _gpu_summary(self) -> str:
        return ", ".join(f"{name} {role.gpus}" for name, role in self.roles.present().items() if role.gpus)


# ---------------------------------------------------------------------------------------------
# Status (written by the operator only)
# ---------------------------------------------------------------------------------------------


class Status(BaseModel):
    """Base of status models: camelCase, unknown fields ignored (kopf keeps its own state there)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


Phase = Literal["Pending", "Scheduling", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]


class Condition(Status):
    """A condition in the shape of the built-in controllers' (metav1.Condition)."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="Condition type in CamelCase: Placed, Ready, Progressing, Succeeded, Failed, Suspended.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="One CamelCase word saying why, e.g. Unschedulable, BackoffLimitExceeded.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )


class RoleStatus(Status):
    """Readiness of one role's device group."""

    ranks: list[int] = Field(
        default_factory=list, max_length=MAX_TOTAL_GPUS, description="Global ranks of the role."
    )
    pods: int = Field(default=0, ge=0, le=MAX_PODS, description="Pods holding at least one of its ranks.")
    ready_pods: int = Field(default=0, ge=0, le=MAX_PODS, description="Of those, pods that are Ready.")
    ready: bool = Field(default=False, description="All of its pods are Ready.")


class PodPlacementStatus(Status):
    """Where one pod of the gang runs."""

    name: str = Field(max_length=DNS_LABEL_MAX, description="Pod name.")
    index: int = Field(ge=0, le=MAX_PODS, description="Pod index (NODE_RANK).")
    node: str = Field(max_length=MAX_NAME_LEN, description="Node the pod is planned on or bound to.")
    ranks: list[int] = Field(
        default_factory=list, max_length=MAX_GPUS_PER_POD, description="Global ranks in the pod."
    )
    roles: list[Literal["actor", "critic", "reward", "reference"]] = Field(
        default_factory=list, max_length=len(ROLE_NAMES), description="Roles with a rank in the pod."
    )


class PlacementStatus(Status):
    """The placement the operator chose."""

    pods: list[PodPlacementStatus] = Field(
        default_factory=list, max_length=MAX_PODS, description="Node of each pod, by pod index."
    )
    device_map: dict[str, Annotated[list[int], Field(max_length=MAX_TOTAL_GPUS)]] = Field(
        default_factory=dict, max_length=len(ROLE_NAMES), description="Global ranks of each role."
    )
    domains: dict[str, Annotated[str, Field(max_length=LABEL_KEY_MAX + 1 + LABEL_VALUE_MAX)]] = Field(
        default_factory=dict,
        max_length=len(ROLE_NAMES),
        description="Per role, 'topologyKey=value' of the tightest domain that holds its group.",
    )
    fallback: bool = Field(
        default=False,
        description="True when a preferred placement could not keep some group inside one domain.",
    )


class ProgressStatus(Status):
    """Training progress, as rank 0's /progress last reported it."""

    step: int | None = Field(default=None, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps the run will do.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Real (non-pad) tokens trained per second, whole job."
    )
    mfu: float | None = Field(default=None, ge=0, description="Model FLOPs utilization, 0 to 1.")
    gpu_utilization: float | None = Field(
        default=None, ge=0, description="Mean GPU utilization over the job's GPUs, 0 to 1."
    )
    loss: float | None = Field(default=None, description="Training loss of the latest step.")
    reward_mean: float | None = Field(default=None, description="Mean rollout reward (ppo, grpo).")
    updated_at: datetime | None = Field(default=None, description="When this was last read.")


class RLTrainingJobStatus(Status):
    """Observed state of the job, written by the operator."""

    phase: Phase = Field(
        default="Pending",
        description="Pending (accepted, not yet placed), Scheduling (placed, pods starting), Running, "
        "Restarting (gang restarting from a checkpoint), Succeeded, Failed, Suspended.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Latest observations of the job's state, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the status was computed for."
    )
    gpus: int | None = Field(
        default=None, ge=0, le=MAX_TOTAL_GPUS, description="GPUs of the job (sum of the roles' own gpus)."
    )
    roles: dict[str, RoleStatus] = Field(
        default_factory=dict, max_length=len(ROLE_NAMES), description="Readiness of each role's group."
    )
    placement: PlacementStatus | None = Field(default=None, description="Where the gang's pods run.")
    progress: ProgressStatus | None = Field(default=None, description="Training progress.")
    restarts: int = Field(
        default=0, ge=0, description="Gang restarts so far after retriable failures (counted against "
        "runPolicy.backoffLimit)."
    )
    start_time: datetime | None = Field(default=None, description="When the gang's pods were first created.")
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")


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


class RLTrainingJob(BaseModel):
    """An RLTrainingJob object as written in a manifest."""

    model_config = ConfigDict(extra="forbid")

    api_version: Literal["rlkube.io/v1alpha1"] = Field(alias="apiVersion", description="API version.")
    kind: Literal["RLTrainingJob"] = Field(description="Kind.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: RLTrainingJobSpec = Field(description="Desired state.")
    status: dict[str, Any] | None = Field(default=None, description="Observed state (ignored here).")


def job_name_problem(name: str) -> str | None:
    """Why `name` cannot be a job name (derived pod and Service names must be DNS labels), or None."""
    if len(name) > MAX_JOB_NAME_LEN:
        return (
            f"must be at most {MAX_JOB_NAME_LEN} characters, got {len(name)}: pods are named "
            f"<job>-<slot>-<index> and must fit a {DNS_LABEL_MAX}-character DNS label"
        )
    if not re.fullmatch(JOB_NAME_PATTERN, name):
        return (
            f"must be lower-case letters, digits and '-', start with a letter and end with a letter "
            f"or digit (it names the job's Service), got {name!r}"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Parsing and error reporting
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldError:
    """One user-facing validation error: a dotted camelCase field path and what would be valid."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


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


_PATH_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*): (.*)$", re.S)


def field_errors(
    exc: ValidationError, prefix: tuple[str | int, ...] = (), model: type[BaseModel] | None = None
) -> list[FieldError]:
    """Turn a pydantic ValidationError into FieldErrors with camelCase dotted paths.

    A model validator's message may start with a relative path ("roles.critic: ...") and may hold
    several problems on separate lines; each becomes its own FieldError under the validator's
    location.
    """
    out: list[FieldError] = []
    for error in exc.errors(include_url=False):
        loc = (*prefix, *error["loc"])
        kind = error["type"]
        if kind == "value_error":
            text = str(error.get("ctx", {}).get("error", error["msg"]))
            for line in text.splitlines() or [text]:
                match = _PATH_PREFIX.match(line)
                if match:
                    out.append(FieldError(join_path((*loc, match.group(1))), match.group(2)))
                else:
                    out.append(FieldError(join_path(loc), line))
            continue
        out.append(FieldError(join_path(loc), describe_error(error, _model_at(model, error["loc"]))))
    return out


def join_path(loc: tuple[str | int, ...]) -> str:
    """('spec', 'tolerations', 0, 'key') -> 'spec.tolerations[0].key'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_error(error: Any, parent: type[BaseModel] | None = None) -> str:
    """What is wrong and what would be valid, for one pydantic error (not a value_error)."""
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    got = f", got {_show(value)}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}{got}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}{got}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}{got}"
    if kind == "less_than":
        return f"must be < {ctx['lt']}{got}"
    if kind == "literal_error":
        expected = str(ctx["expected"])
        return f"must be {expected}{got}" if " or " not in expected else f"must be one of {expected}{got}"
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        names = _field_names(parent)
        field = str(error["loc"][-1]) if error["loc"] else ""
        close = difflib.get_close_matches(field, names, n=1, cutoff=0.6)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        hint = f" (valid fields: {', '.join(names)})" if names else ""
        return f"unknown field{guess}{hint}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be an integer{got}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"must be a finite number{got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"must be true or false{got}"
    if kind in ("string_type", "string_unicode"):
        return f"must be a string{got}"
    if kind == "string_too_long":
        return f"must be at most {ctx['max_length']} characters, got {len(value)}"
    if kind == "string_too_short":
        return f"must be at least {ctx['min_length']} characters{got}"
    if kind == "string_pattern_mismatch":
        pattern = ctx["pattern"]
        return f"must be {_PATTERN_NAMES[pattern]}{got}" if pattern in _PATTERN_NAMES else f"must match {pattern}{got}"
    if kind == "too_long":
        return f"must have at most {ctx['max_length']} items, got {ctx.get('actual_length')}"
    if kind == "too_short":
        return f"must have at least {ctx['min_length']} items, got {ctx.get('actual_length')}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping{got}"
    if kind == "list_type":
        return f"must be a list{got}"
    if kind in ("datetime_type", "datetime_parsing", "datetime_from_date_parsing"):
        return f"must be an RFC 3339 date-time{got}"
    return str(error["msg"])


# Patterns as a user would name them, for error messages.
_PATTERN_NAMES = {
    QUANTITY_PATTERN: "a Kubernetes quantity such as '500m', '2' or '16Gi'",
    LABEL_KEY_PATTERN: "a label key such as 'kubernetes.io/hostname' (no spaces; optional 'prefix/')",
    LABEL_VALUE_PATTERN: "a label value (letters, digits, '-', '_' and '.', at most 63 characters)",
    DNS_SUBDOMAIN_PATTERN: "a DNS subdomain name (lower-case letters, digits, '-' and '.')",
    DNS_LABEL_PATTERN: "a DNS label (lower-case letters, digits and '-')",
}


def _pattern_of(model: type[BaseModel], field: str) -> str:
    return next(m.pattern for m in model.model_fields[field].metadata if getattr(m, "pattern", None))


_PATTERN_NAMES[_pattern_of(RoleSpec, "function")] = (
    "an import path 'package.module:function', e.g. 'rlkube.runtime.rewards:target_pattern'"
)
_PATTERN_NAMES[_pattern_of(CheckpointSpec, "volume_claim")] = (
    "a PersistentVolumeClaim name (lower-case letters, digits, '-' and '.')"
)


def _field_names(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_at(root: type[BaseModel] | None, loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class holding the field at `loc` (for listing valid fields), if one is found."""
    if root is None:
        return None
    current: Any = root
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = next(
                (info for name, info in current.model_fields.items() if part in (name, info.alias)), None
            )
            if field is None:
                return None
            current = _unwrap(field.annotation)
        elif isinstance(current, tuple):  # (container, item type)
            current = _unwrap(current[1])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated; lists and dicts become (container, item type)."""
    while True:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType):
            rest = [a for a in args if a is not type(None)]
            if len(rest) != 1:
                return annotation
            annotation = rest[0]
        elif origin in (list, tuple):
            return ("list", args[0])
        elif origin is dict:
            return ("dict", args[1])
        else:
            return annotation
