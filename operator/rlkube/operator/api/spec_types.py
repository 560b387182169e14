"""The spec of an RLTrainingJob: `RLTrainingJobSpec` and the sections only the operator reads.

The spec is the runtime's `RunSections` (`rlkube.runtime.contract.config`: algorithm, model,
roles, data, batching, training, rollout, checkpoint, export, declared and validated there once)
plus what only the operator needs: placement, elasticity, run policy and the pod template knobs
(image, resources, node selection). `runtime_config` hands the sections to the trainer as they
are. The job's own cross-field rules live in model validators here; the CRD carries the same
rules as CEL so the API server enforces them at admission too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from rlkube.operator.api.limits import (
    DEFAULT_TOPOLOGY_KEYS,
    DNS_LABEL_MAX,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_MAX,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_MAX,
    LABEL_VALUE_PATTERN,
    MAX_GPUS_PER_POD,
    MAX_PODS,
    QUANTITY_MAX_LEN,
    QUANTITY_PATTERN,
)
from rlkube.operator.api.validation import spec_problems
from rlkube.operator.api.validation.paths import VOLUME_SOURCE, volume_problems
from rlkube.operator.api.validation.pod import RESOURCES, SECURITY, TOLERATION, label_key_problem
from rlkube.operator.api.validation.rule import check
from rlkube.operator.api.validation.rule import problems as rule_problems
from rlkube.operator.api.validation.sections import ELASTIC
from rlkube.runtime.contract.config import (
    MAX_NAME_LEN,
    MAX_PATH_LEN,
    RunSections,
    RuntimeConfig,
    Spec,
    device_map,
)
from rlkube.runtime.contract.pod import (
    EXIT_CONFIG,
    EXIT_MEANINGS,
    EXIT_NON_FINITE,
    EXIT_TERMINATED,
    PERMANENT_EXIT_CODES,
    PROGRESS_PORT,
)

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
    on a ReadWriteMany volume). PPO/GRPO: a mini-batch (globalBatch x groupSize / miniBatches)
    must split evenly over the actor's GPUs at every size in the range, not only the full one."""

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
        check(ELASTIC, self)
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
        default_factory=lambda: list(PERMANENT_EXIT_CODES),
        max_length=32,
        description="Trainer exit codes that fail the job at once instead of restarting it "
        f"({EXIT_CONFIG}: invalid config, {EXIT_NON_FINITE}: non-finite loss).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @field_validator("fail_on_exit_codes")
    @classmethod
    def _unique_codes(cls, codes: list[int]) -> list[int]:
        duplicates = sorted({code for code in codes if codes.count(code) > 1})
        if duplicates:
            raise ValueError(f"must not repeat a code, got {', '.join(map(str, duplicates))} more than once")
        if EXIT_TERMINATED in codes:
            raise ValueError(
                f"must not contain {EXIT_TERMINATED}: that code means {EXIT_MEANINGS[EXIT_TERMINATED]}"
            )
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

    @model_validator(mode="after")
    def _requests_within_limits(self) -> PodResources:
        check(RESOURCES, self)
        return self


class Toleration(Spec):
    """A pod toleration, as in the Pod API."""

    key: str | None = Field(
        default=None,
        max_length=LABEL_KEY_MAX,
        pattern=LABEL_KEY_PATTERN,
        description="Taint key the toleration matches; unset with operator Exists matches all taints.",
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="How key and value match.")
    value: str | None = Field(
        default=None,
        max_length=LABEL_VALUE_MAX,
        pattern=LABEL_VALUE_PATTERN,
        description="Taint value (operator Equal).",
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
        check(TOLERATION, self)
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

    @model_validator(mode="after")
    def _consistent(self) -> PodSecurity:
        check(SECURITY, self)
        return self


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
        problems = [*rule_problems([VOLUME_SOURCE], self), *volume_problems(self.name, self.mount_path, self.host_path)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------


class RLTrainingJobSpec(RunSections):
    """Desired state of an RL post-training run: what to train, on which GPUs, and how."""

    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Packing of GPUs into pods and topology-aware placement."
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Elastic size range in pods, for jobs whose only GPUs are the actor's (PPO/GRPO: a "
        "mini-batch must split evenly over the actor's GPUs at every size of the range). Unset: the job "
        "runs with exactly the pods its roles' GPUs make.",
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

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, selector: dict[str, str]) -> dict[str, str]:
        problems = [f"key {key!r}: {problem}" for key in selector if (problem := label_key_problem(key))]
        if problems:
            raise ValueError("\n".join(problems))
        return selector

    @field_validator("volumes")
    @classmethod
    def _unique_volumes(cls, volumes: list[VolumeSpec]) -> list[VolumeSpec]:
        names = [volume.name for volume in volumes]
        paths = [volume.mount_path for volume in volumes]
        for what, values in (("name", names), ("mountPath", paths)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                raise ValueError(f"each {what} must be unique, got {', '.join(repeated)} more than once")
        return volumes

    def problems(self) -> list[str]:
        """The run's rules across sections (`RunSections`), then the job's own: paths, model types,
        sources and elastic splits (`validation.spec_problems`), and the GPUs making whole pods."""
        problems = super().problems()
        problems.extend(spec_problems(self))
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
        return problems

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
        """The trainer's config for this spec (what the operator renders into run.yaml), serving
        on the port the operator probes and polls (the contract's, not a spec field)."""
        return RuntimeConfig(
            **self.sections(),
            device_map=device_map if device_map is not None else self.device_map(),
            progress_port=PROGRESS_PORT,
        )

    def _gpu_summary(self) -> str:
        return ", ".join(f"{name} {role.gpus}" for name, role in self.roles.present().items() if role.gpus)
