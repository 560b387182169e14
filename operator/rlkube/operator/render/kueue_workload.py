"""The Kueue Workload that stands for an RLTrainingJob in a Kueue queue. Pure.

A job labelled `kueue.x-k8s.io/queue-name: <LocalQueue>` is admitted by Kueue as one unit: the
operator creates a `Workload` (kueue.x-k8s.io/v1beta2) whose one pod set is the job's gang
(`count` pods, each asking for gpusPerPod `nvidia.com/gpu` plus the job's cpu/memory), waits for
Kueue's `Admitted` condition before it plans and creates pods, and when Kueue evicts the
Workload (preemption, a stopped queue) tears the gang down, keeps the checkpoint, and hands the
quota back so the Workload queues again. docs/kueue.md says why the operator owns a Workload
instead of using Kueue's pod-group integration.

This module builds the Workload and the status patches the operator writes to it, and reads
what Kueue wrote back; it never talks to the API. The contract with Kueue is the one Kueue's own
job integrations follow (pkg/controller/jobframework in Kueue's tree):
- Kueue sets `QuotaReserved`, then `Admitted` once every admission check passed;
  `status.admission.podSetAssignments[].count` is the number of pods admitted (less than the
  pod set's count only for an elastic job, through Kueue's partial admission and `minCount`).
- Kueue sets `Evicted` (reason Preempted, PodsReadyTimeout, ClusterQueueStopped, ...). The
  owner stops its pods, then clears `status.admission`, sets `QuotaReserved` False (reason
  Pending) and `Requeued` (True after a preemption or node failure: the Workload queues again at
  once), which releases the quota: `release_patch`.
- When the job ends the owner sets `Finished` True (reason Succeeded or Failed), which releases
  the quota for good: `finish_patch`.
No finalizer is put on the Workload: it is owned by its job (ownerReference, controller), so
garbage collection deletes it with the job.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlkube.operator.api import RLTrainingJobSpec
from rlkube.operator.api.observed import KUEUE_QUEUE_LABEL, LABEL_JOB, TRAINER_CONTAINER, JobRef
from rlkube.operator.api.pod_spec import ResourceList
from rlkube.operator.planning.placement import GPU_RESOURCE
from rlkube.operator.render import MANAGED_BY

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "workloads"
QUEUE_LABEL = KUEUE_QUEUE_LABEL
POD_SET = "workers"
WORKLOAD_PREFIX = "rltj-"

# Condition types and reasons Kueue writes (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
# Evictions after which Kueue's own integrations requeue the Workload at once (the others, such
# as a stopped queue, wait until Kueue sets Requeued itself).
REQUEUE_AT_ONCE = frozenset({"Preempted", "NodeFailures"})
# Kueue truncates condition messages to this length; so do we, so a patch is never refused.
MAX_MESSAGE = 32768


def queue_of(job: JobRef) -> str | None:
    """The LocalQueue a job asks for (its kueue.x-k8s.io/queue-name label), or None: not queued."""
    queue = (job.labels or {}).get(QUEUE_LABEL, "")
    return queue or None


def workload_name(job_name: str) -> str:
    """One Workload per job: a requeued job keeps it (and its place in Kueue's history)."""
    return f"{WORKLOAD_PREFIX}{job_name}"


def _quantities(resources: ResourceList) -> dict[str, str]:
    # Resource names, not the API types' camelCase aliases (ephemeralStorage is no resource).
    names = {"cpu": resources.cpu, "memory": resources.memory, "ephemeral-storage": resources.ephemeral_storage}
    return {name: value for name, value in names.items() if value is not None}


def _pod_counts(spec: RLTrainingJobSpec) -> tuple[int, int | None]:
    """(count, minCount) of the gang: an elastic job asks for maxWorkers and accepts minWorkers."""
    counts = spec.worker_counts()
    most, least = max(counts), min(counts)
    return most, (least if least < most else None)


def _pod_template(job: JobRef, spec: RLTrainingJobSpec) -> dict:
    """What Kueue needs of a gang pod to count its quota and pick a ResourceFlavor: the trainer's
    requests and limits (GPUs as render.render_pod sets them), node selector and tolerations."""
    gpus = str(spec.placement.gpus_per_pod)
    container = {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "resources": {
            "requests": {**_quantities(spec.resources.requests), GPU_RESOURCE: gpus},
            "limits": {**_quantities(spec.resources.limits), GPU_RESOURCE: gpus},
        },
    }
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    return {"metadata": {"labels": {LABEL_JOB: job.name}}, "spec": pod_spec}


def render_workload(job: JobRef, spec: RLTrainingJobSpec, queue: str, priority: int | None = None) -> dict:
    """The Workload that queues `job` in the LocalQueue `queue` of the job's namespace.

    `priority` is the value of the job's PriorityClass (spec.priorityClassName), which the caller
    reads from the API: Kueue orders and preempts by it, and refuses a class reference without it.
    """
    count, min_count = _pod_counts(spec)
    pod_set: dict[str, Any] = {"name": POD_SET, "count": count, "template": _pod_template(job, spec)}
    if min_count is not None:
        pod_set["minCount"] = min_count
    workload_spec: dict[str, Any] = {"queueName": queue, "podSets": [pod_set]}
    if spec.priority_class_name and priority is not None:
        workload_spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io", "kind": "PriorityClass", "name": spec.priority_class_name,
        }  # fmt: skip
        workload_spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job.name),
            "namespace": job.namespace,
            "labels": {
                "app.kubernetes.io/name": "rlkube",
                "app.kubernetes.io/managed-by": MANAGED_BY,
                LABEL_JOB: job.name,
                QUEUE_LABEL: queue,
            },
            "ownerReferences": [job.owner_reference()],
        },
        "spec": workload_spec,
    }


# -- what Kueue wrote -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadState:
    """A Workload as the operator decides on it."""

    name: str
    queue: str
    admitted: bool             # Admitted True: the gang may start
    quota_reserved: bool       # QuotaReserved True (admission checks may still be pending)
    finished: bool             # Finished True: the owner released the quota for good
    evicted: bool              # Evicted True while quota is held: stop the gang, then release it
    reason: str                # of the condition that explains the state (Evicted, QuotaReserved...)
    message: str
    cluster_queue: str | None  # status.admission.clusterQueue, once quota is reserved
    admitted_pods: int | None  # pods admitted in our pod set (partial admission may give fewer)
    asked_pods: int | None = None  # our pod set's count: maxWorkers for an elastic job

    def waiting_message(self) -> str:
        """What `kubectl describe` shows while the job waits for admission."""
        why = f": {self.message}" if self.message else ""
        return f"waiting for Kueue admission in queue {self.queue}{why}"

    @property
    def worker_cap(self) -> int | None:
        """The most pods the job may run with while this admission holds: the admitted count of
        an admitted Workload that is not being evicted; None when there is no such admission.
        The planner never plans, nor grows to, more (Kueue counted quota for these pods only)."""
        if not self.admitted or self.evicted:
            return None
        return self.admitted_pods

    @property
    def partial(self) -> bool:
        """Kueue admitted fewer pods than the pod set asks for (partial admission, `minCount`)."""
        return None not in (self.admitted_pods, self.asked_pods) and self.admitted_pods < self.asked_pods

    def admission_message(self) -> str:
        """"admitted N of M pods by Kueue": what Events and conditions say of the admission."""
        return f"admitted {self.admitted_pods} of {self.asked_pods} pods by Kueue"


def _conditions(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (workload.get("status") or {}).get("conditions") or []}


def _true(conditions: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conditions.get(kind, {}).get("status") == "True"


def observe_workload(workload: Mapping[str, Any]) -> WorkloadState:
    conditions = _conditions(workload)
    admission = (workload.get("status") or {}).get("admission") or {}
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    asked_pods = next((p.get("count") for p in pod_sets if p.get("name") == POD_SET), None)
    admitted_pods = None
    for assignment in admission.get("podSetAssignments") or []:
        if assignment.get("name") == POD_SET:
            admitted_pods = assignment.get("count")
    if admitted_pods is None and admission:
        admitted_pods = asked_pods  # Kueue leaves count out when the whole pod set was admitted
    quota_reserved = _true(conditions, QUOTA_RESERVED)
    # Kueue leaves Evicted True after the owner released the quota, until it reserves quota
    # again: only an eviction that still holds quota asks the owner to act.
    evicted = _true(conditions, EVICTED) and quota_reserved
    explaining = next(
        (conditions[k] for k, holds in ((FINISHED, _true(conditions, FINISHED)), (EVICTED, evicted),
                                        (ADMITTED, _true(conditions, ADMITTED))) if holds),
        conditions.get(QUOTA_RESERVED, {}),
    )
    return WorkloadState(
        name=(workload.get("metadata") or {}).get("name", ""),
        queue=(workload.get("spec") or {}).get("queueName", ""),
        admitted=_true(conditions, ADMITTED),
        quota_reserved=quota_reserved,
        finished=_true(conditions, FINISHED),
        evicted=evicted,
        reason=explaining.get("reason", ""),
        message=explaining.get("message", ""),
        cluster_queue=admission.get("clusterQueue"),
        admitted_pods=admitted_pods,
        asked_pods=asked_pods,
    )


# -- what the operator writes -----------------------------------------------------------------


def _time(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: Sequence[Mapping[str, Any]], kind: str, status: bool, reason: str, message: str,
                  now: dt.datetime, generation: int) -> list[dict]:
    """`conditions` with `kind` set; its lastTransitionTime moves only when its status does
    (what apimachinery's SetStatusCondition does, which Kueue reads the times by)."""
    new = {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "observedGeneration": generation,
        "lastTransitionTime": _time(now),
    }
    out, found = [], False
    for old in conditions:
        if old.get("type") == kind:
            found = True
            if old.get("status") == new["status"]:
                new["lastTransitionTime"] = old.get("lastTransitionTime", new["lastTransitionTime"])
            out.append(new)
        else:
            out.append(dict(old))
    if not found:
        out.append(new)
    return out


def _status_patch(workload: Mapping[str, Any], status: dict) -> dict:
    # The resourceVersion makes the merge patch conditional: the conditions list is replaced
    # whole, so a write based on a stale read must fail (409) rather than drop Kueue's update.
    meta = workload.get("metadata") or {}
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}


def finish_patch(workload: Mapping[str, Any], succeeded: bool, message: str, now: dt.datetime) -> dict:
    """Status merge patch for workloads/status: the job ended, the quota goes back to the queue."""
    generation = int((workload.get("metadata") or {}).get("generation") or 0)
    conditions = (workload.get("status") or {}).get("conditions") or []
    reason = "Succeeded" if succeeded else "Failed"
    return _status_patch(workload, {"conditions": set_condition(conditions, FINISHED, True, reason, message,
                                                                now, generation)})


def release_patch(workload: Mapping[str, Any], now: dt.datetime) -> dict:
    """Status merge patch for workloads/status once an evicted job's pods are gone: admission
    cleared, QuotaReserved and Admitted False, Requeued as Kueue's own integrations set it."""
    generation = int((workload.get("metadata") or {}).get("generation") or 0)
    conditions = (workload.get("status") or {}).get("conditions") or []
    evicted = _conditions(workload).get(EVICTED, {})
    reason, message = evicted.get("reason", "Evicted"), evicted.get("message", "evicted by Kueue")
    conditions = set_condition(conditions, REQUEUED, reason in REQUEUE_AT_ONCE, reason, message, now, generation)
    conditions = set_condition(conditions, QUOTA_RESERVED, False, "Pending", message, now, generation)
    conditions = set_condition(conditions, ADMITTED, False, "NoReservation", "The workload has no reservation",
                               now, generation)
    return _status_patch(workload, {"admission": None, "conditions": conditions})
