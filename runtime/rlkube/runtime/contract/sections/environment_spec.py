"""`roles.environment`: the job's environment, a scalable HTTP service of CPU pods that scores
completions (verifiers: a code sandbox, a math checker) and, later, steps multi-turn episodes
(tools). It has no GPUs and no place in the device map: the operator runs it as a Deployment and a
Service beside the gang, and the trainer reaches it at the URL the operator puts in the pod's
environment (`contract.pod.ENV_ENVIRONMENT_URL`). The protocol it speaks is
`contract.environment_protocol` (docs/environments.md).

`roles.reward.remote: true` makes the reward role score through it (`roles_spec`); the rules that
tie the two together, and that only PPO/GRPO take an environment, are `ENVIRONMENT_RULES`,
reported with the other rules across the spec (`algorithm_settings`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from rlkube.runtime.contract.algorithms import ONLINE_ALGORITHMS
from rlkube.runtime.contract.environment_protocol import MAX_ITEMS_PER_CALL
from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.spec import MAX_NAME_LEN, Spec

DEFAULT_ENVIRONMENT_PORT = 8000
MAX_ENVIRONMENT_REPLICAS = 1000
# A Kubernetes quantity ('500m', '2Gi'), as the API server's own pattern has it.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
Argument = Annotated[str, Field(max_length=4096)]


def _quantity(description: str) -> Any:
    return Field(default=None, max_length=64, pattern=QUANTITY_PATTERN, description=description)


class EnvironmentQuantities(Spec):
    """CPU and memory of one environment pod (Kubernetes quantities)."""

    cpu: str | None = _quantity("CPU, e.g. '500m' or '2'.")
    memory: str | None = _quantity("Memory, e.g. '512Mi'.")


class EnvironmentResources(Spec):
    """Requests and limits of each environment pod. The sandbox's own limits (CPU seconds, memory
    per execution) are the image's settings; these bound the whole pod."""

    requests: EnvironmentQuantities = Field(default_factory=EnvironmentQuantities, description="Requests.")
    limits: EnvironmentQuantities = Field(default_factory=EnvironmentQuantities, description="Limits.")


class EnvironmentVar(Spec):
    """One environment variable of the environment's container."""

    name: str = Field(max_length=MAX_NAME_LEN, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str = Field(default="", max_length=4096, description="Its value.")


class EnvironmentClientSpec(Spec):
    """How the trainer calls the environment (rewards/remote.py): read once, at the trainer's start."""

    concurrency: int = Field(
        default=8, ge=1, le=256,
        description="Calls in flight at once from one trainer process. Raise it with the replicas: each "
        "call's completions are checked one after another, so replicas beyond concurrency calls sit idle.",
    )
    batch_size: int = Field(
        default=16, ge=1, le=MAX_ITEMS_PER_CALL, description="Completions per /v1/score call."
    )
    timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Each call's timeout; a call that runs over is retried."
    )
    retries: int = Field(
        default=4, ge=0, le=20,
        description="Retries of a failed call (timeout, no connection, 429 or 5xx), with doubling backoff; "
        "an item that still fails is masked out of the loss and counted, never scored as 0.",
    )


class EnvironmentSpec(Spec):
    """The environment service: replicas of one image serving the environment protocol
    (/healthz, /v1/score, /v1/step) on `port`. CPU only; scaled by changing `replicas`."""

    replicas: int = Field(
        default=1, ge=1, le=MAX_ENVIRONMENT_REPLICAS,
        description="Pods serving the environment. The only field of roles that may change on a running "
        "job: the operator scales the environment's Deployment to it.",
    )
    image: str = Field(
        max_length=1024, pattern=r"^[^\s]+$",
        description="Container image serving the environment protocol, e.g. 'localhost/rlkube/environment:dev'. "
        "Immutable.",
    )
    command: list[Argument] = Field(
        default_factory=list, max_length=64,
        description="The container's command (its entrypoint); empty: the image's own. Immutable.",
    )
    args: list[Argument] = Field(
        default_factory=list, max_length=256,
        description="The container's arguments; empty: the image's own. Immutable.",
    )
    port: int = Field(
        default=DEFAULT_ENVIRONMENT_PORT, ge=1, le=65535,
        description="Port the environment serves HTTP on (its Service exposes the same). Immutable.",
    )
    env: list[EnvironmentVar] = Field(
        default_factory=list, max_length=64, description="Environment variables of the container. Immutable."
    )
    resources: EnvironmentResources = Field(
        default_factory=EnvironmentResources, description="CPU and memory of each environment pod. Immutable."
    )
    client: EnvironmentClientSpec = Field(
        default_factory=EnvironmentClientSpec,
        description="How the trainers call the environment: calls in flight, completions per call, timeout and "
        "retries. Immutable (read when the trainers start).",
    )
    allow_egress: bool = Field(
        default=False,
        description="The environment's pods may open connections out, e.g. a tool that calls a web API. Off, a "
        "NetworkPolicy denies them every outbound connection where the cluster's network plugin enforces "
        "NetworkPolicies (Calico, Cilium, ...); either way they accept connections only from the job's trainer "
        "pods, and the sandbox keeps its own in-process block on the network. Immutable.",
    )


def _remote(spec: Any) -> bool:
    reward = spec.roles.reward
    return reward is not None and bool(reward.remote)


ENVIRONMENT_RULES: tuple[Rule, ...] = (
    Rule("roles.environment: only ppo and grpo use an environment (it scores rollouts)",
         "!has(self.roles.environment) || " + " || ".join(f"self.algorithm == '{a}'" for a in ONLINE_ALGORITHMS),
         lambda s: when(s.roles.environment is not None and s.algorithm not in ONLINE_ALGORITHMS,
                        f", algorithm is {s.algorithm}"), ".roles.environment"),
    Rule("roles.reward.remote: scoring through the environment needs roles.environment",
         "!has(self.roles.reward) || !has(self.roles.reward.remote) || !self.roles.reward.remote || "
         "has(self.roles.environment)",
         lambda s: when(_remote(s) and s.roles.environment is None), ".roles.reward.remote"),
    Rule("roles.reward.gpus: must be 0 with remote: true (the environment scores; the reward role needs no "
         "GPUs of its own): set roles.reward.gpus to 0",
         "!has(self.roles.reward) || !has(self.roles.reward.remote) || !self.roles.reward.remote || "
         "!has(self.roles.reward.gpus) || self.roles.reward.gpus == 0",
         lambda s: when(_remote(s) and (s.roles.reward.gpus or 0) > 0,
                        f", got {s.roles.reward.gpus}" if _remote(s) else ""),
         ".roles.reward.gpus"),
)

# On the CRD's roles object: the GPU roles are immutable, the environment may only change its
# replicas (each of its other fields carries its own immutability rule in the CRD, `crd_rules`).
ENVIRONMENT_FIELDS_IMMUTABLE = ("image", "command", "args", "port", "env", "resources", "client", "allowEgress")
