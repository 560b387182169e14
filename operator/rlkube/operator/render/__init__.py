"""Rendering: an RLTrainingJob and its placement -> the Kubernetes objects that run it. Pure.

The render package is what the operator writes, as pure functions of what it read: the gang's
objects (this module), the job's status (`status`), the Kueue Workload of a queued job
(`kueue_workload`) and the checkpoint cleanup pods and records (`cleanup`). It reads the API
types and planning's `Placement`, nothing above them.

Objects. `render(job, spec, placement, attempt)` returns the job's
headless Service, its ConfigMap (run.yaml: the `RuntimeConfig` the trainer reads, with the
placement's device map) and one Pod per planned slot. The operator creates whichever of them is
missing; because every name is deterministic, a rerun after a crash meets AlreadyExists instead
of making a duplicate.

Names. Pods are `<job>-<slot>-<index>`: `index` is the pod index (0-based over the whole gang,
also the pod's label rlkube.io/pod-index) and `slot` the first role that owns GPUs in the pod (its
ranks decide it, so it does not change when a re-plan moves the pod). The pod name is also its
hostname under the headless Service `<job>`, which selects pod 0, so `<pod 0>.<job>.<namespace>.svc`
(MASTER_ADDR) resolves; the API types bound the job name so this stays a DNS label. Pod names are reused across restart attempts:
a new attempt is created only once the previous one is gone, so no two pods ever hold the same
index.

What a pod gets: required node affinity to its planned node (by `metadata.name`), plus the
user's nodeSelector and tolerations; `nvidia.com/gpu` requests and limits equal to gpusPerPod;
the env of the operator->runtime contract (`rlkube.runtime.contract.pod`; nothing the runtime
does not read; the environment's URL where the job has one, whose Deployment and Service are
`render.environment`'s); probes on /healthz; `/dev/shm` as a memory emptyDir (NCCL and DataLoader workers
need more than the 64 MiB default); a checkpoint volume (the PVC of `checkpoint.volumeClaim`, else
a hostPath per node under /var/lib/rlkube/<namespace>/<job>-<uid>, so a gang restarted on the
same nodes resumes); where the cluster offers one (`CompileCacheVolume`, the chart's compileCache
values), a volume for torch.compile's caches and its path in RLKUBE_COMPILE_CACHE; restartPolicy Never (the operator restarts whole gangs); and a restricted
security context (non-root 1000, no privilege escalation, seccomp RuntimeDefault, all
capabilities dropped) unless the spec's securityContext overrides the user, group or non-root
setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rlkube.operator.api import RLTrainingJobSpec
from rlkube.operator.api.observed import (
    GANG_GATE,
    GPUS_ANNOTATION,
    PLANNED_NODE_ANNOTATION,
    TRAINER_CONTAINER,
    VOLCANO_SCHEDULER,
    JobRef,
    uses_gang_gate,
)
from rlkube.operator.planning.placement import GPU_RESOURCE, Placement, PodPlan
from rlkube.operator.render.environment import environment_url
from rlkube.runtime.contract.config import ROLE_NAMES
from rlkube.runtime.contract.pod import (
    CONFIG_DIR,
    CONFIG_FILE,
    CONFIG_PATH,
    ENV_ATTEMPT,
    ENV_COMPILE_CACHE,
    ENV_CONFIG,
    ENV_ENVIRONMENT_URL,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK_BASE,
    ENV_WORLD_SIZE,
    HEALTH_PATH,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_POD_INDEX,
    MASTER_PORT,
    MASTER_PORT_NAME,
    PROGRESS_PORT,
    PROGRESS_PORT_NAME,
)

HOST_CHECKPOINT_ROOT = "/var/lib/rlkube"
COMPILE_CACHE_VOLUME = "rlkube-compile-cache"  # validation.paths.RESERVED_VOLUME_NAMES holds it


@dataclass(frozen=True)
class CompileCacheVolume:
    """A volume the cluster's operator mounts into every trainer pod for torch.compile's caches,
    so a restarted pod (another node, a fresh checkpoint directory, a new job of the same model
    shape) starts from compiled graphs: a PersistentVolumeClaim in the job's namespace, or a
    hostPath directory on every node (created if missing). The runtime uses it where a job names
    no checkpoint.compileCacheDir."""

    mount_path: str
    claim_name: str = ""
    host_path: str = ""

    def volume(self) -> dict:
        source = ({"persistentVolumeClaim": {"claimName": self.claim_name}} if self.claim_name
                  else {"hostPath": {"path": self.host_path, "type": "DirectoryOrCreate"}})
        return {"name": COMPILE_CACHE_VOLUME, **source}
DEFAULT_UID = 1000
# Time the trainer gets on SIGTERM to write a checkpoint and exit 143.
TERMINATION_GRACE_SECONDS = 120
MANAGED_BY = "rlkube-operator"


# -- names ------------------------------------------------------------------------------------


def service_name(job_name: str) -> str:
    return job_name


def configmap_name(job_name: str) -> str:
    return f"{job_name}-config"


def slot_name(ranks: tuple[int, ...] | list[int], device_map: Mapping[str, list[int]], owners: set[str]) -> str:
    """The first GPU-owning role (canonical order) with a rank in `ranks`."""
    for role in ROLE_NAMES:
        if role in owners and set(device_map.get(role, ())) & set(ranks):
            return role
    return "actor"


def gpu_owners(spec: RLTrainingJobSpec) -> set[str]:
    """Roles with GPUs of their own (not colocated, not gpus: 0)."""
    return {name for name, role in spec.roles.present().items() if role.gpus}


def pod_name(job_name: str, slot: str, index: int) -> str:
    return f"{job_name}-{slot}-{index}"


def pod_names(job_name: str, spec: RLTrainingJobSpec) -> list[str]:
    """Every pod name of the full gang, by pod index (depends on the spec only, not the plan)."""
    device_map = spec.device_map()
    owners = gpu_owners(spec)
    per_pod = spec.placement.gpus_per_pod
    return [
        pod_name(job_name, slot_name(list(range(i * per_pod, (i + 1) * per_pod)), device_map, owners), i)
        for i in range(spec.pod_count())
    ]


def master_addr(job: JobRef, spec: RLTrainingJobSpec) -> str:
    """DNS name of pod 0 through the headless Service (the search path supplies the cluster domain)."""
    return f"{pod_names(job.name, spec)[0]}.{service_name(job.name)}.{job.namespace}.svc"


def checkpoint_host_path(job: JobRef) -> str:
    """The node directory of a job's checkpoints. The UID is part of it: a job deleted and
    re-created under the same name is a new run and must not resume the old run's checkpoint,
    while a gang restart of the same job (same UID) finds its own."""
    return f"{HOST_CHECKPOINT_ROOT}/{job.namespace}/{job.name}-{job.uid}"


# -- objects ----------------------------------------------------------------------------------


def _labels(job: JobRef, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "rlkube",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_JOB: job.name,
    }
    labels.update(extra or {})
    return labels


def _metadata(job: JobRef, name: str, labels: Mapping[str, str] | None = None, **extra: Any) -> dict:
    meta = {
        "name": name,
        "namespace": job.namespace,
        "labels": _labels(job, labels),
        "ownerReferences": [job.owner_reference()],
    }
    meta.update(extra)
    return meta


def render_service(job: JobRef) -> dict:
    """The headless Service that gives pod 0 the DNS name `<pod>.<job>` (MASTER_ADDR).

    It selects pod 0 alone: MASTER_ADDR is the only name any rank resolves (the rest of the
    rendezvous goes through pod 0's store, by IP), and each pod's own name is in its /etc/hosts
    from hostname and subdomain. Selecting every pod made the endpoints controllers rewrite the
    job's Endpoints and EndpointSlice as each pod got its IP (issue 20's 17:00 run: 5,381 such
    requests for 1,000 jobs, 0.67 per pod); with pod 0 alone they change once per attempt."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: job.name, LABEL_POD_INDEX: "0"},
            # Ranks resolve MASTER_ADDR while pod 0 is still starting, long before it is Ready.
            "publishNotReadyAddresses": True,
            "ports": [{"name": MASTER_PORT_NAME, "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"}],
        },
    }


def runtime_config_yaml(spec: RLTrainingJobSpec, device_map: Mapping[str, list[int]]) -> str:
    """run.yaml: the trainer's RuntimeConfig as camelCase YAML, device map filled in."""
    config = spec.runtime_config(device_map={k: list(v) for k, v in device_map.items()})
    data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    # libyaml's dumper when present: the pure-Python one takes ~50 ms for this document.
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False)


def render_configmap(job: JobRef, spec: RLTrainingJobSpec, device_map: Mapping[str, list[int]]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, configmap_name(job.name)),
        "data": {CONFIG_FILE: runtime_config_yaml(spec, device_map)},
    }


def _quantities(resource_list: Any) -> dict[str, str]:
    out = {}
    for field, key in (("cpu", "cpu"), ("memory", "memory"), ("ephemeral_storage", "ephemeral-storage")):
        value = getattr(resource_list, field)
        if value is not None:
            out[key] = value
    return out


def _security(spec: RLTrainingJobSpec) -> tuple[dict, dict]:
    """(pod securityContext, container securityContext): restricted unless overridden."""
    override = spec.security_context
    uid = override.run_as_user if override and override.run_as_user is not None else DEFAULT_UID
    gid = override.run_as_group if override and override.run_as_group is not None else uid
    fs_group = override.fs_group if override and override.fs_group is not None else gid
    if override and override.run_as_non_root is not None:
        non_root = override.run_as_non_root
    else:
        non_root = uid != 0
    pod = {
        "runAsNonRoot": non_root,
        "runAsUser": uid,
        "runAsGroup": gid,
        "fsGroup": fs_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": non_root,
    }
    return pod, container


def _env(job: JobRef, spec: RLTrainingJobSpec, plan: PodPlan, attempt: int,
         cache: CompileCacheVolume | None = None) -> list[dict]:
    """The contract's OPERATOR_ENV, each read by the runtime. A pod's roles, index and name are
    not passed: the runtime derives its roles from run.yaml's device map and its rank."""
    values = {
        ENV_MASTER_ADDR: master_addr(job, spec),
        ENV_MASTER_PORT: str(MASTER_PORT),
        ENV_WORLD_SIZE: str(spec.total_gpus()),
        ENV_RANK_BASE: str(plan.ranks[0]),
        ENV_LOCAL_WORLD_SIZE: str(len(plan.ranks)),
        ENV_CONFIG: CONFIG_PATH,
        ENV_ATTEMPT: str(attempt),
    }
    url = environment_url(job, spec)
    if url is not None:  # roles.environment: its Service (render/environment.py)
        values[ENV_ENVIRONMENT_URL] = url
    if cache is not None:
        values[ENV_COMPILE_CACHE] = cache.mount_path
    return [{"name": k, "value": v} for k, v in values.items()]


def _probes() -> dict:
    def probe(period: int, failures: int) -> dict:
        return {
            "httpGet": {"path": HEALTH_PATH, "port": PROGRESS_PORT_NAME},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": 5,
        }

    return {
        # The trainer answers /healthz within its first second or two (before importing torch),
        # so a short period makes the pod Started early; loading a model and starting NCCL may
        # take minutes, which the failure budget (10 min) covers. Liveness starts after this.
        "startupProbe": probe(2, 300),
        "livenessProbe": probe(20, 6),
        "readinessProbe": probe(10, 3),
    }


def _volumes(job: JobRef, spec: RLTrainingJobSpec, cache: CompileCacheVolume | None = None
             ) -> tuple[list[dict], list[dict]]:
    """(volumes, trainer volumeMounts)."""
    volumes: list[dict] = [
        {"name": "config", "configMap": {"name": configmap_name(job.name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "checkpoints", "mountPath": spec.checkpoint.dir},
    ]
    claim = spec.checkpoint.volume_claim
    if claim:
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
    else:
        volumes.append({
            "name": "checkpoints",
            "hostPath": {"path": checkpoint_host_path(job), "type": "DirectoryOrCreate"},
        })
    for extra in spec.volumes:
        source = (
            {"persistentVolumeClaim": {"claimName": extra.claim_name, "readOnly": extra.read_only}}
            if extra.claim_name
            else {"hostPath": {"path": extra.host_path, "type": "Directory"}}
        )
        volumes.append({"name": extra.name, **source})
        mounts.append({"name": extra.name, "mountPath": extra.mount_path, "readOnly": extra.read_only})
    if cache is not None:
        volumes.append(cache.volume())
        mounts.append({"name": COMPILE_CACHE_VOLUME, "mountPath": cache.mount_path})
    return volumes, mounts


def _checkpoint_dir_owner(spec: RLTrainingJobSpec, pod_security: dict, image: str) -> list[dict]:
    """An init container that hands a hostPath checkpoint directory to the trainer's user.

    The kubelet creates a DirectoryOrCreate hostPath as root with mode 0755 and fsGroup does not
    apply to hostPath, so a non-root trainer could not write its checkpoints. The init container
    runs as root with only CAP_CHOWN and chowns that one directory. A PVC needs none of this.
    """
    if spec.checkpoint.volume_claim or pod_security["runAsUser"] == 0:
        return []
    uid, gid = pod_security["runAsUser"], pod_security["runAsGroup"]
    return [{
        "name": "checkpoint-dir",
        "image": image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-c", f"import os; os.chown({spec.checkpoint.dir!r}, {uid}, {gid})"],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        },
        "volumeMounts": [{"name": "checkpoints", "mountPath": spec.checkpoint.dir}],
    }]


def progress_port(spec: RLTrainingJobSpec) -> int:
    """Port of the trainer's /healthz, /progress and /metrics: the contract's PROGRESS_PORT for
    every job (the spec has no port field; run.yaml is rendered with this one)."""
    return PROGRESS_PORT


def render_pod(job: JobRef, spec: RLTrainingJobSpec, placement: Placement, plan: PodPlan, attempt: int,
               cache: CompileCacheVolume | None = None) -> dict:
    """The pod of one planned slot, for restart attempt `attempt` (`cache`: CompileCacheVolume)."""
    device_map = placement.device_map
    name = pod_name(job.name, slot_name(plan.ranks, device_map, gpu_owners(spec)), plan.index)
    gpus = str(spec.placement.gpus_per_pod)
    requests = {**_quantities(spec.resources.requests), GPU_RESOURCE: gpus}
    limits = {**_quantities(spec.resources.limits), GPU_RESOURCE: gpus}
    pod_security, container_security = _security(spec)
    volumes, mounts = _volumes(job, spec, cache)
    ports = [
        {"name": PROGRESS_PORT_NAME, "containerPort": progress_port(spec), "protocol": "TCP"},
        {"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"},
    ]
    container = {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python", "-m", "rlkube.runtime", "run", CONFIG_PATH],
        "env": _env(job, spec, plan, attempt, cache),
        "ports": ports,
        "resources": {"requests": requests, "limits": limits},
        "securityContext": container_security,
        "volumeMounts": mounts,
        **_probes(),
    }
    pod_spec: dict[str, Any] = {
        "hostname": name,
        "subdomain": service_name(job.name),
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        # The trainer never talks to the API server; its pod gets no token.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [plan.node]}],
                    }],
                },
            },
        },
        "securityContext": pod_security,
        "initContainers": _checkpoint_dir_owner(spec, pod_security, spec.image),
        "containers": [container],
        "volumes": volumes,
    }
    if not pod_spec["initContainers"]:
        del pod_spec["initContainers"]
    if uses_gang_gate(job, spec):
        pod_spec["schedulingGates"] = [{"name": GANG_GATE}]
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in spec.tolerations
        ]
    if spec.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduler_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    annotations = {
        "rlkube.io/ranks": ",".join(map(str, plan.ranks)),
        "rlkube.io/roles": ",".join(plan.roles),
        PLANNED_NODE_ANNOTATION: plan.node,
        # With the planned node, what the operator's inventory reads from pod metadata alone.
        GPUS_ANNOTATION: gpus,
    }
    if spec.scheduler_name == VOLCANO_SCHEDULER:
        annotations["scheduling.k8s.io/group-name"] = job.name
    labels = {LABEL_ATTEMPT: str(attempt), LABEL_POD_INDEX: str(plan.index)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, name, labels, annotations=annotations),
        "spec": pod_spec,
    }


def render(job: JobRef, spec: RLTrainingJobSpec, placement: Placement, attempt: int,
           cache: CompileCacheVolume | None = None) -> list[dict]:
    """Every object of one attempt: [Service, ConfigMap, Pod 0, Pod 1, ...]."""
    return [
        render_service(job),
        render_configmap(job, spec, placement.device_map),
        *(render_pod(job, spec, placement, plan, attempt, cache) for plan in placement.pods),
    ]
