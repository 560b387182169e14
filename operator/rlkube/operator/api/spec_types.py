"""The spec of an RLTrainingJob: `RLTrainingJobSpec`.

The spec is the runtime's `RunSections` (`rlkube.runtime.contract.config`: algorithm, model,
roles, data, batching, training, rollout, checkpoint, export, declared and validated there once)
plus the sections only the operator reads, each in its module with its own rules
(`placement_spec`, `elastic_spec`, `run_policy_spec`, `pod_spec`, `volume_spec`), and the pod
template's plain fields (image, node selection, scheduler). `runtime_config` hands the run's
sections to the trainer as they are. The rules across the job are `validation.spec_problems`,
run by the validator `RunSections` declares; the CRD carries the same rules as CEL so the API
server enforces them at admission too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from rlkube.operator.api.elastic_spec import ElasticSpec
from rlkube.operator.api.limits import DNS_SUBDOMAIN_PATTERN, LABEL_VALUE_MAX, LABEL_VALUE_PATTERN
from rlkube.operator.api.placement_spec import PlacementSpec
from rlkube.operator.api.pod_spec import PodResources, PodSecurity, Toleration, label_key_problem
from rlkube.operator.api.run_policy_spec import RunPolicySpec
from rlkube.operator.api.validation import spec_problems
from rlkube.operator.api.volume_spec import VolumeSpec
from rlkube.runtime.contract.config import MAX_NAME_LEN, RunSections, RuntimeConfig, device_map
from rlkube.runtime.contract.pod import OUTPUT_SUBDIR, PROGRESS_PORT
from rlkube.runtime.contract.spec import repeated


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
        max_length=1024, pattern=r"^[^\s]+$",
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
        default_factory=dict, max_length=64,
        description="Node labels every pod requires (added to the placement's node affinity).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of every pod (GPU node taints, say)."
    )
    scheduler_name: str | None = Field(
        default=None, max_length=MAX_NAME_LEN, pattern=DNS_SUBDOMAIN_PATTERN,
        description="Scheduler of the pods (a gang scheduler such as Volcano). Unset: the default "
        "scheduler.",
    )
    priority_class_name: str | None = Field(
        default=None, max_length=MAX_NAME_LEN, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of the pods. Unset: the cluster's default priority.",
    )
    service_account_name: str | None = Field(
        default=None, max_length=MAX_NAME_LEN, pattern=DNS_SUBDOMAIN_PATTERN,
        description="ServiceAccount the pods run as. Unset: the namespace's default.",
    )
    security_context: PodSecurity | None = Field(
        default=None, description="Overrides of the pods' security context."
    )
    volumes: list[VolumeSpec] = Field(
        default_factory=list, max_length=16,
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
            if twice := repeated(values):
                raise ValueError(f"each {what} must be unique, got {', '.join(twice)} more than once")
        return volumes

    def problems(self) -> list[str]:
        """The run's rules across sections (`RunSections`), then the job's own
        (`validation.spec_problems`: paths, model types, sources, the GPUs making whole pods, the
        elastic range and its splits)."""
        return [*super().problems(), *spec_problems(self)]

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
        on the port the operator probes and polls (the contract's, not a spec field). Its outputDir
        (tracker files, the tokenised data's cache) is on the checkpoint volume, so both outlive
        the pod: a restarted pod reads its cache and a user finds the TensorBoard or MLflow files."""
        return RuntimeConfig(
            **self.sections(),
            device_map=device_map if device_map is not None else self.device_map(),
            progress_port=PROGRESS_PORT,
            output_dir=f"{self.checkpoint.dir.rstrip('/')}/{OUTPUT_SUBDIR}",
        )

