"""The environment of a job (`roles.environment`) as Kubernetes objects, and its status. Pure.

An environment is stateless CPU work behind one URL, so it is a Deployment and a headless
Service, with a NetworkPolicy around its pods, `<job>-environment` all three, owned by the job
(garbage collection deletes them with it), not pods of the gang: it is not gang-scheduled, not
restarted with the trainers, and scaling it (`replicas`, the one field of roles that may change
on a running job) is the Deployment's own rolling work. Its pods carry the label
rlkube.io/environment=<job>, not rlkube.io/job, so the operator never counts them as trainer pods.

Security is the trainers' restricted profile (non-root 1000, seccomp RuntimeDefault, all
capabilities dropped, no privilege escalation) plus a read-only root filesystem, with an
emptyDir at /tmp for the sandbox's scratch files; no service account token. The trainer pods
get the Service's URL in RLKUBE_ENVIRONMENT_URL (`environment_url`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlkube.operator.api import RLTrainingJobSpec
from rlkube.operator.api.observed import JobRef
from rlkube.runtime.contract.environment_protocol import HEALTH_PATH
from rlkube.runtime.contract.pod import LABEL_ENVIRONMENT, LABEL_JOB
from rlkube.runtime.contract.sections import EnvironmentSpec

ENVIRONMENT_CONTAINER = "environment"
PORT_NAME = "http"
DEFAULT_UID = 1000
SCRATCH_DIR = "/tmp"
SCRATCH_LIMIT = "1Gi"


def environment_name(job_name: str) -> str:
    """The Deployment's and the Service's name (a DNS label: job names are at most 40 characters)."""
    return f"{job_name}-environment"


def environment_url(job: JobRef, spec: RLTrainingJobSpec) -> str | None:
    """The URL the trainers reach the environment at (None: the job has none). The namespace
    is part of the name so it resolves from any pod; the search path adds the cluster domain."""
    environment = spec.roles.environment
    if environment is None:
        return None
    return f"http://{environment_name(job.name)}.{job.namespace}.svc:{environment.port}"


def _selector(job: JobRef) -> dict[str, str]:
    return {LABEL_ENVIRONMENT: job.name}


def _metadata(job: JobRef, labels: Mapping[str, str]) -> dict:
    return {"name": environment_name(job.name), "namespace": job.namespace, "labels": dict(labels),
            "ownerReferences": [job.owner_reference()]}


def _labels(job: JobRef) -> dict[str, str]:
    return {"app.kubernetes.io/name": "rlkube-environment", "app.kubernetes.io/managed-by": "rlkube-operator",
            **_selector(job)}


def _resources(environment: EnvironmentSpec) -> dict:
    out: dict[str, dict[str, str]] = {}
    for key, quantities in (("requests", environment.resources.requests), ("limits", environment.resources.limits)):
        values = {name: value for name, value in (("cpu", quantities.cpu), ("memory", quantities.memory)) if value}
        if values:
            out[key] = values
    return out


def _container(environment: EnvironmentSpec, pull_policy: str) -> dict:
    probe = {"httpGet": {"path": HEALTH_PATH, "port": PORT_NAME}, "timeoutSeconds": 5}
    container: dict[str, Any] = {
        "name": ENVIRONMENT_CONTAINER,
        "image": environment.image,
        "imagePullPolicy": pull_policy,
        "ports": [{"name": PORT_NAME, "containerPort": environment.port, "protocol": "TCP"}],
        "env": [{"name": var.name, "value": var.value} for var in environment.env],
        "resources": _resources(environment),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH_DIR}],
        # Ready only while it answers: the Service sends no calls to a replica that is starting.
        "readinessProbe": {**probe, "periodSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
    }
    if environment.command:
        container["command"] = list(environment.command)
    if environment.args:
        container["args"] = list(environment.args)
    if not container["env"]:
        del container["env"]
    return container


def render_deployment(job: JobRef, spec: RLTrainingJobSpec, replicas: int | None = None) -> dict:
    """The environment's Deployment, at `replicas` (default: the spec's)."""
    environment = spec.roles.environment
    assert environment is not None, "render_deployment needs roles.environment"
    labels = _labels(job)
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": DEFAULT_UID,
            "runAsGroup": DEFAULT_UID,
            "fsGroup": DEFAULT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(environment, spec.image_pull_policy)],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": SCRATCH_LIMIT}}],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in spec.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(job, labels),
        "spec": {
            "replicas": environment.replicas if replicas is None else replicas,
            "selector": {"matchLabels": _selector(job)},
            # A replica replaced (a new image never happens: it is immutable) starts before the old goes.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_environment_service(job: JobRef, spec: RLTrainingJobSpec) -> dict:
    """The headless Service of the environment's ready replicas: its name resolves to their
    addresses, and the trainers' client spreads its calls over them itself (rewards/remote.py),
    round robin, moving to the next address on a retry. No kube-proxy is needed, and a call never
    sits on a kept-alive connection to a replica that is gone."""
    environment = spec.roles.environment
    assert environment is not None, "render_environment_service needs roles.environment"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, _labels(job)),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(job),
            "ports": [{"name": PORT_NAME, "port": environment.port, "targetPort": PORT_NAME, "protocol": "TCP"}],
        },
    }


def render_network_policy(job: JobRef, spec: RLTrainingJobSpec) -> dict:
    """The NetworkPolicy around the environment's pods: connections in only from the job's own
    trainer pods (label rlkube.io/job, same namespace) on the environment's port, and none out
    unless `allowEgress` (an Egress policy type with no egress rule denies every outbound
    connection, DNS included: the environment is called, it calls no one). The cluster's network
    plugin enforces it where it enforces NetworkPolicies at all; the sandbox's in-process block
    on the network stays either way."""
    environment = spec.roles.environment
    assert environment is not None, "render_network_policy needs roles.environment"
    trainers = {"podSelector": {"matchLabels": {LABEL_JOB: job.name}}}
    policy: dict[str, Any] = {
        "podSelector": {"matchLabels": _selector(job)},
        "policyTypes": ["Ingress"] if environment.allow_egress else ["Ingress", "Egress"],
        "ingress": [{"from": [trainers], "ports": [{"protocol": "TCP", "port": environment.port}]}],
    }
    if not environment.allow_egress:
        policy["egress"] = []
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, _labels(job)),
        "spec": policy,
    }


def render_environment(job: JobRef, spec: RLTrainingJobSpec) -> list[dict]:
    """[Deployment, Service, NetworkPolicy] of the job's environment; [] without one."""
    if spec.roles.environment is None:
        return []
    return [render_deployment(job, spec), render_environment_service(job, spec), render_network_policy(job, spec)]


def wanted_replicas(spec: RLTrainingJobSpec, phase: str | None) -> int:
    """Replicas the environment should run: the spec's while the job may still train, none once
    it finished (the Deployment stays, empty, until the job is deleted)."""
    environment = spec.roles.environment
    if environment is None or phase in ("Succeeded", "Failed"):
        return 0
    return environment.replicas


def environment_status(spec: RLTrainingJobSpec, job: JobRef, deployment: Mapping[str, Any] | None,
                       phase: str | None) -> dict | None:
    """status.environment: the replicas asked for, those ready (from the Deployment's status) and the
    URL; None for a job without an environment."""
    url = environment_url(job, spec)
    if url is None:
        return None
    observed = (deployment or {}).get("status") or {}
    return {"replicas": wanted_replicas(spec, phase), "readyReplicas": int(observed.get("readyReplicas") or 0),
            "url": url}
