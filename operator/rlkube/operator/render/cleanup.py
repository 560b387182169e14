"""hostPath checkpoint folders removed when their job is deleted. Pure.

A job without `checkpoint.volumeClaim` keeps its checkpoints in a hostPath of each node it ran on,
/var/lib/rlkube/<namespace>/<job>-<uid> (render.checkpoint_host_path); the status lists those
nodes (`status.checkpointNodes`, every node a plan of the job used). Garbage collection removes the
job's pods but nothing on the nodes, so when the operator sees the job's DELETED event it creates
one short pod per such node (one in all when the operator was told the hostPath root is shared),
pinned there by nodeName, that removes the folder (and the namespace's folder once it is empty).
Finished cleanup pods are deleted by the operator (handlers.py).

Retention, as documented in docs/scheduling.md: checkpoints stay while the job exists (a finished
job keeps them, to export or inspect); they go with the job.

A DELETED event is not replayed: a job deleted while no operator runs (it exited after losing its
Lease to an API-server outage, say) would keep its folders. So before a job's first pods are
created the operator writes a *checkpoint record*, a ConfigMap apart from the job (no
ownerReference, so it outlives it) that says where the folders are: the job's name, UID, image
and nodes. The DELETED handler removes the record once it has made the cleanup pods; a sweep at
operator start and every few minutes (checkpoint_sweep.py) lists the records, then the jobs, and
cleans for every record whose job UID is gone. Listing records first is what makes it safe
without clocks: a record exists only after its job did, so a job missing from the later listing
was deleted. Limits: a node that is down when the job goes keeps its folder (its cleanup pod
fails after CLEANUP_DEADLINE_SECONDS, or waits for the node: a pod bound to a lost node is
deleted with it), and a namespace deleted while no operator runs takes the records with it.

The cleanup pod runs as root: the folder's parent is root's (the kubelet creates hostPath folders
as root), and the job's own namespace already runs root init containers for hostPath checkpoints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from rlkube.operator.api.observed import JobRef, JobView
from rlkube.operator.render import HOST_CHECKPOINT_ROOT, MANAGED_BY, checkpoint_host_path
from rlkube.operator.render.status import STATUS_CHECKPOINT_NODES

LABEL_CLEANUP = "rlkube.io/checkpoint-cleanup"
LABEL_RECORD = "rlkube.io/checkpoint-record"
ANNOTATION_JOB_UID = "rlkube.io/job-uid"
CLEANUP_DEADLINE_SECONDS = 300
MOUNT = "/rlkube-checkpoints"

_SCRIPT = """import os, shutil, sys
folder, parent = sys.argv[1], os.path.dirname(sys.argv[1])
shutil.rmtree(folder, ignore_errors=True)
try:
    os.rmdir(parent)
except OSError:
    pass
print("removed" if not os.path.exists(folder) else "NOT removed", folder, flush=True)
sys.exit(0 if not os.path.exists(folder) else 1)
"""


def checkpoint_nodes(job: Mapping[str, Any]) -> list[str]:
    """The nodes whose hostPath may hold the job's checkpoints (none with a volumeClaim)."""
    spec, status = job.get("spec") or {}, job.get("status") or {}
    if (spec.get("checkpoint") or {}).get("volumeClaim"):
        return []
    nodes = set(status.get(STATUS_CHECKPOINT_NODES) or ())
    nodes.update(p.get("node") for p in (status.get("placement") or {}).get("pods") or [] if p.get("node"))
    return sorted(nodes)


def cleanup_pods(job: Mapping[str, Any], host_path_shared: bool = False) -> list[dict]:
    """One pod per node that removes the deleted `job`'s hostPath checkpoint folder there."""
    meta, spec = job["metadata"], job.get("spec") or {}
    nodes = checkpoint_nodes(job)
    if host_path_shared:
        nodes = nodes[:1]  # one filesystem: any node sees the folder
    if not nodes or not spec.get("image"):
        return []
    ref = JobRef(meta["name"], meta["namespace"], meta["uid"])
    folder = checkpoint_host_path(ref)
    inside = f"{MOUNT}{folder[len(HOST_CHECKPOINT_ROOT):]}"
    return [_pod(ref, spec, node, inside) for node in nodes]


def cleanup_pod_name(job_name: str, uid: str, node: str) -> str:
    """Deterministic, so a repeated DELETED event meets AlreadyExists instead of a second pod."""
    digest = hashlib.sha256(f"{uid}/{node}".encode()).hexdigest()[:8]
    return f"{job_name[:220]}-ckpt-cleanup-{digest}"


def _pod(ref: JobRef, spec: Mapping[str, Any], node: str, folder: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": cleanup_pod_name(ref.name, ref.uid, node),
            "namespace": ref.namespace,
            "labels": {LABEL_CLEANUP: ref.name[:63].rstrip("-_."), "app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {ANNOTATION_JOB_UID: ref.uid},
        },
        "spec": {
            "nodeName": node,  # that node's folder, whatever the scheduler would say
            "restartPolicy": "Never",
            "activeDeadlineSeconds": CLEANUP_DEADLINE_SECONDS,
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "cleanup",
                "image": spec["image"],
                "imagePullPolicy": spec.get("imagePullPolicy") or "IfNotPresent",
                "command": ["python", "-c", _SCRIPT, folder],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                # Root without DAC_OVERRIDE could not remove the trainer's files (its uid, 0755).
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"], "add": ["DAC_OVERRIDE"]}},
                "volumeMounts": [{"name": "checkpoints", "mountPath": MOUNT}],
            }],
            "volumes": [{"name": "checkpoints",
                         "hostPath": {"path": HOST_CHECKPOINT_ROOT, "type": "DirectoryOrCreate"}}],
        },
    }  # fmt: skip


def finished(pod: Mapping[str, Any]) -> str | None:
    """"Succeeded"/"Failed" for a cleanup pod that ended (to be deleted), else None."""
    phase = (pod.get("status") or {}).get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


# -- checkpoint records: where a job's folders are, kept apart from the job ----------------------------


def record_name(job_name: str, uid: str) -> str:
    """Deterministic per job UID: a new job of the same name gets its own record."""
    return f"{job_name[:200]}-ckpt-{uid[:8]}"


def record(job: JobView, status: Mapping[str, Any]) -> dict | None:
    """The ConfigMap that remembers where `job`'s hostPath checkpoints are (the nodes of `status`,
    the status being written with the pods), or None when it keeps none there."""
    spec = job.spec
    if spec is None or spec.checkpoint.volume_claim or not spec.image:
        return None
    nodes = checkpoint_nodes({"spec": {}, "status": status})
    if not nodes:
        return None
    ref = job.ref
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(ref.name, ref.uid),
            "namespace": ref.namespace,
            "labels": {LABEL_RECORD: ref.name[:63].rstrip("-_."), "app.kubernetes.io/managed-by": MANAGED_BY},
            "annotations": {ANNOTATION_JOB_UID: ref.uid},
        },
        "data": {"job": ref.name, "uid": ref.uid, "image": spec.image,
                 "imagePullPolicy": spec.image_pull_policy, "nodes": "\n".join(nodes)},
    }  # fmt: skip


def job_of_record(configmap: Mapping[str, Any]) -> dict:
    """The deleted job, as much of it as cleanup_pods needs, from its record."""
    meta, data = configmap["metadata"], configmap.get("data") or {}
    return {
        "metadata": {"name": data.get("job", ""), "namespace": meta["namespace"], "uid": data.get("uid", "")},
        "spec": {"image": data.get("image", ""), "imagePullPolicy": data.get("imagePullPolicy")},
        "status": {STATUS_CHECKPOINT_NODES: [n for n in data.get("nodes", "").split("\n") if n]},
    }


def orphaned(records: Iterable[Mapping[str, Any]], live_uids: set[str]) -> list[Mapping[str, Any]]:
    """The records whose job is gone. `live_uids` must be listed AFTER `records`: a record is
    written only once its job exists, so a job missing from the later listing was deleted (a job
    created after the records were listed has no record in them)."""
    return [r for r in records if (r.get("data") or {}).get("uid") and r["data"]["uid"] not in live_uids]
