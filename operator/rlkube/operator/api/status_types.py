"""The status of an RLTrainingJob, written by the operator only (pods never write to the API).

These models give `status` its CRD schema; `rlkube.operator.render.status` computes the values.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from rlkube.operator.api.limits import (
    DNS_LABEL_MAX,
    LABEL_KEY_MAX,
    LABEL_VALUE_MAX,
    MAX_GPUS_PER_POD,
    MAX_PODS,
    MAX_TOTAL_GPUS,
)
from rlkube.runtime.contract.config import MAX_NAME_LEN, MAX_PATH_LEN, ROLE_NAMES
from rlkube.runtime.contract.pod import LABEL_POD_INDEX


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
    index: int = Field(
        ge=0, le=MAX_PODS, description=f"Pod index, 0-based over the gang (the pod's label {LABEL_POD_INDEX})."
    )
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


class StartupStatus(Status):
    """Where the time from the trainer's process start to the end of its first step went (rank 0,
    this attempt), in seconds. The runtime reports it with the start and completes it with the
    first step (docs/architecture.md, "Where start-up time goes")."""

    import_: float | None = Field(default=None, alias="import", ge=0,
                                  description="Process start to the trainer's build: interpreter, torch, rendezvous.")
    data_load: float | None = Field(
        default=None, ge=0,
        description="Reading and tokenising the data set, on a thread while the models load (overlaps modelLoad).",
    )
    data_wait: float | None = Field(
        default=None, ge=0, description="Of dataLoad: what the build waited for the data where it first needed it."
    )
    model_load: float | None = Field(
        default=None, ge=0,
        description="The rest of the build: models, optimizers, memory plan, checkpoint restore (less dataWait).",
    )
    restore: float | None = Field(
        default=None, ge=0,
        description="Of modelLoad, a resumed run only: reading the checkpoint into the models and optimizers, and "
        "torch.compile's artifacts saved with it.",
    )
    first_step: float | None = Field(default=None, ge=0, description="The first step, compile and capture included.")
    compile: float | None = Field(
        default=None, ge=0, description="Of the first step: torch.compile's compile time, by torch's own timers."
    )
    decode_capture: float | None = Field(
        default=None, ge=0, description="Of the first step: setting up decoding, its KV cache and CUDA graphs (ppo, grpo)."
    )
    total: float | None = Field(default=None, ge=0, description="Process start to the last stage reported.")


class ProgressStatus(Status):
    """Training progress, as rank 0's /progress last reported it."""

    step: int | None = Field(default=None, ge=0, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps the run will do.")
    tokens_per_second: float | None = Field(
        default=None, ge=0, description="Real (non-pad) tokens trained per second, whole job."
    )
    step_seconds: float | None = Field(
        default=None, ge=0, description="Wall seconds of the latest optimizer step: the pace etaSeconds assumes."
    )
    percent: float | None = Field(
        default=None, ge=0, le=100, description="step / totalSteps, in percent (one decimal)."
    )
    eta_seconds: int | None = Field(
        default=None, ge=0, description="Seconds left at the latest step's pace: (totalSteps - step) x "
        "stepSeconds. Evaluation and checkpoint time between steps is not in the pace."
    )
    tokens_per_second_per_gpu: float | None = Field(
        default=None, ge=0, description="tokensPerSecond over the job's GPUs (status.gpus)."
    )
    mfu: float | None = Field(default=None, ge=0, description="Model FLOPs utilization, 0 to 1.")
    gpu_utilization: float | None = Field(
        default=None, ge=0, description="Mean GPU utilization over the job's GPUs, 0 to 1."
    )
    loss: float | None = Field(default=None, description="Training loss of the latest step.")
    reward_mean: float | None = Field(default=None, description="Mean rollout reward (ppo, grpo).")
    eval_step: int | None = Field(default=None, ge=0, description="Optimizer steps done at the latest evaluation.")
    eval_accuracy: float | None = Field(
        default=None, ge=0, description="dpo, kto: implicit-reward accuracy on the eval set at evalStep, 0 to 1."
    )
    eval_reward_mean: float | None = Field(
        default=None,
        description="ppo, grpo: mean reward of greedy completions of the eval prompts at evalStep (dpo, kto: "
        "mean implicit reward of the chosen or desirable responses).",
    )
    memory_plan: str | None = Field(
        default=None, max_length=1024,
        description="Rank 0's GPU memory plan, made before the first step: what the GPU holds (weights, "
        "gradients, AdamW state, KV cache, checkpoint snapshot, reserve, in GiB) and the budgets left for batches "
        "(batching.memoryFraction of the card).",
    )
    startup_seconds: StartupStatus | None = Field(
        default=None, description="Where this attempt's start-up time went, to the end of its first step."
    )
    updated_at: datetime | None = Field(default=None, description="When this was last read.")


class ModelOutputStatus(Status):
    """A Hugging Face model directory the run exported (config.json, safetensors, tokenizer)."""

    path: str = Field(
        max_length=MAX_PATH_LEN,
        description="Directory in the trainer's pods (on the checkpoint volume unless export.dir moves it).",
    )
    step: int = Field(ge=0, description="Optimizer steps the exported weights have been trained for.")


class OutputsStatus(Status):
    """What the run left for users to serve, as rank 0 last reported it."""

    model: ModelOutputStatus | None = Field(
        default=None,
        description="The latest export of the trained actor, for AutoModelForCausalLM.from_pretrained "
        "(a LoRA run: only with export.mergeLora).",
    )
    adapter: ModelOutputStatus | None = Field(
        default=None,
        description="A LoRA run's latest adapter (PEFT's format), for PeftModel.from_pretrained(base model, path).",
    )


class SummaryStatus(Status):
    """The run's summary, as rank 0 reported it once the run succeeded and its last checkpoint was
    committed (the trainer's `"event": "summary"` log line has the same figures)."""

    steps: int | None = Field(default=None, ge=0, description="Optimizer steps the last attempt computed.")
    first_step: int | None = Field(default=None, ge=0, description="The first of them (1-based).")
    last_step: int | None = Field(default=None, ge=0, description="The last of them: the steps the model has.")
    tokens: int | None = Field(default=None, ge=0, description="Real (non-pad) tokens trained on in those steps.")
    gpus: int | None = Field(default=None, ge=0, le=MAX_TOTAL_GPUS, description="GPUs (trainer processes) of the run.")
    wall_seconds: float | None = Field(
        default=None, ge=0, description="Wall seconds from rank 0's process start to the summary."
    )
    startup_seconds: float | None = Field(
        default=None, ge=0, description="Of those, the start-up: process start to the end of the first step."
    )
    training_seconds: float | None = Field(
        default=None, ge=0, description="Training time: the start of training to the end of the last step "
        "(checkpoint stalls and evaluations count)."
    )
    tail_seconds: float | None = Field(
        default=None, ge=0, description="The tail: the end of the last step until the final checkpoint and "
        "the export are both committed."
    )
    tokens_per_second_per_gpu: float | None = Field(
        default=None, ge=0, description="tokens / trainingSeconds / gpus."
    )
    gpu_busy_mean: float | None = Field(
        default=None, ge=0, description="Mean over steps of the least busy GPU's busy fraction, 0 to 1 "
        "(unset on CPUs)."
    )
    peak_memory_fraction: float | None = Field(
        default=None, ge=0, description="The largest fraction of a GPU's memory any step held (unset on CPUs)."
    )
    peak_memory_gib: float | None = Field(
        default=None, ge=0, alias="peakMemoryGiB", description="peakMemoryFraction in GiB of the card."
    )
    checkpoint: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, description="The newest committed checkpoint, in the trainer's pods."
    )
    model: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, description="The exported model's directory (status.outputs.model)."
    )
    adapter: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, description="A LoRA run's exported adapter (status.outputs.adapter)."
    )


class EnvironmentStatus(Status):
    """The environment service (roles.environment), as its Deployment reports it."""

    replicas: int = Field(ge=0, le=1000, description="Replicas asked for (0 once the job finished).")
    ready_replicas: int = Field(
        default=0, ge=0, le=1000, description="Replicas ready to take calls (the Deployment's readyReplicas)."
    )
    url: str = Field(max_length=512, description="Where the trainers reach it (RLKUBE_ENVIRONMENT_URL).")


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
    outputs: OutputsStatus | None = Field(
        default=None, description="What the run exported (the trained model's directory and step)."
    )
    summary: SummaryStatus | None = Field(
        default=None, description="The run's summary once it succeeded: steps, tokens, wall and training "
        "time, tokens per second per GPU, GPU busy, peak memory, the last checkpoint and the export."
    )
    environment: EnvironmentStatus | None = Field(
        default=None, description="The environment service's replicas and URL (jobs with roles.environment)."
    )
    restarts: int = Field(
        default=0, ge=0, description="Gang restarts so far after retriable failures (counted against "
        "runPolicy.backoffLimit)."
    )
    # The next three let a restarted operator continue where the last one stopped.
    attempt: int = Field(
        default=0, ge=0, description="Gang generation: 0 for the first gang, one more at every teardown "
        "(restart, re-plan, suspend). Pods carry it as the label rlkube.io/attempt and in RLKUBE_ATTEMPT; "
        "a pod of an earlier attempt is deleted before the next gang starts."
    )
    next_attempt_time: datetime | None = Field(
        default=None, description="While a restart backs off: when the next attempt may start."
    )
    admission_time: datetime | None = Field(
        default=None, description="When the current gang was admitted (scheduling gates removed, or handed "
        "to Volcano or Kueue); gangTimeoutSeconds counts from it."
    )
    checkpoint_nodes: list[Annotated[str, Field(max_length=253)]] = Field(
        default_factory=list, max_length=MAX_PODS, description="Nodes whose hostPath "
        "(/var/lib/rlkube/<namespace>/<job>-<uid>) holds the job's checkpoints: every node a plan of it used "
        "(none with checkpoint.volumeClaim). The operator removes those folders when the job is deleted.",
    )
    start_time: datetime | None = Field(default=None, description="When the gang's pods were first created.")
    completion_time: datetime | None = Field(default=None, description="When the job succeeded or failed.")
