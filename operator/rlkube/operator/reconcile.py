"""One reconcile of one job: fetch, decide (pure), write. Synchronous; runs on a worker thread.

`Reconciler.reconcile(namespace, name)` reads the job and its pods fresh from the API server
(never from a cache, so a restarted operator decides on the same facts as the one before it),
calls `lifecycle.decide`, lists nodes and bound pods only when the decision needs the GPU
inventory, and applies the decision in the order that keeps every crash recoverable:

1. status (merge patch with the job's resourceVersion: a stale decision fails with Conflict and
   is recomputed, never recorded); a child the API server refuses as invalid (422) fails the job
   in the same reconcile (lifecycle/rejection.py);
2. a queued job's Kueue Workload: created, or its status written (release, finish);
   then pod deletions (grace 0 for pods stranded on a lost node);
3. creations (AlreadyExists is success: names are deterministic);
4. gate removals (JSON patch with `test` ops: only that attempt's pod, only our gate);
5. Events; 6. deleting the job itself (ttlSecondsAfterFinished, with a uid precondition).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rlkube.operator import cleanup, kueue_workload, render
from rlkube.operator.api import API_VERSION, KIND
from rlkube.operator.kubeapi import ApiError, KubeAPI
from rlkube.operator.lifecycle import Decision, Settings, cluster_view, decide
from rlkube.operator.lifecycle.rejection import rejected
from rlkube.operator.metrics import Metrics
from rlkube.operator.observed import GANG_GATE, LABEL_JOB, JobView, owned_by, pod_views
from rlkube.operator.progress_client import poll_progress
from rlkube.operator.status import status_patch

logger = logging.getLogger("rlkube.operator")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)



def final_report(job: JobView, pods: list) -> Mapping[str, Any] | None:
    """The report rank 0 of the current attempt left when it ended (its termination message).

    Read on every reconcile while the job is not yet terminal: no network, and it is the only
    report of a run that ended between two polls. Once the job is terminal it is not read again,
    so a finished job's status is not rewritten on every resync."""
    if job.status.get("phase") in ("Succeeded", "Failed"):
        return None
    attempt = int(job.status.get("attempt") or 0)
    rank0 = next((p for p in pods if p.index == 0 and p.attempt == attempt), None)
    return rank0.final_progress if rank0 is not None else None


class Rejected(Exception):
    """The API server refused to create a child as invalid (422): retrying cannot help."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"the API server refused {kind} {name}: {message}")
        self.kind, self.name, self.message = kind, name, message


class InventoryCache:
    """Nodes and GPU-holding pods, listed at most every `ttl` seconds, plus the pods this
    operator created since the last listing began (a list cannot contain those yet).

    Listing every node and every pod of the cluster for each plan costs seconds once a cluster
    holds hundreds of pods, and plans are made one at a time (under the reconciler's inventory
    lock). Between listings the operator's own creations are the only change that matters for
    over-commit, and those it knows: they are kept in a ledger until a fresh listing includes
    them. Other changes (another scheduler's pods, a node going) are seen within `ttl`.
    """

    def __init__(self, api: KubeAPI, ttl: float = 2.0) -> None:
        self.api = api
        self.ttl = ttl
        self._snapshot: tuple[list[dict], list[dict], list[dict]] | None = None
        self._taken = 0.0
        self.is_fresh = False  # whether the last get() listed anew
        # pod key -> [when its create request finished (None: not yet), the pod]
        self._ledger: dict[tuple[str, str], list] = {}
        self._lock = threading.Lock()
        self._jobs: tuple[float, str | None, list[dict]] | None = None  # (listed with, namespace, jobs)

    def get(self, fresh: bool = False) -> tuple[list[dict], list[dict], list[dict]]:
        """(nodes, bound pods, unbound rlkube pods incl. the ledger's); `fresh`: list now."""
        self.is_fresh = fresh or self._snapshot is None or time.monotonic() - self._taken > self.ttl
        if self.is_fresh:
            started = time.monotonic()
            self._snapshot = (self.api.list_nodes(), self.api.list_bound_pods(), self.api.list_planned_pods())
            self._taken = started
            with self._lock:  # a listing begun after a create finished contains that pod
                self._ledger = {k: v for k, v in self._ledger.items() if v[0] is None or v[0] >= started}
        nodes, bound, planned = self._snapshot
        with self._lock:
            listed = {((p.get("metadata") or {}).get("namespace"), (p.get("metadata") or {}).get("name")) for p in planned}
            extra = [pod for key, (_, pod) in self._ledger.items() if key not in listed]
        return nodes, bound, planned + extra

    @staticmethod
    def _key(pod: dict) -> tuple[str, str]:
        return pod["metadata"]["namespace"], pod["metadata"]["name"]

    def record(self, pods: list[dict]) -> None:
        """Pods a decision is about to create: they count from now on."""
        with self._lock:
            for pod in pods:
                self._ledger[self._key(pod)] = [None, pod]

    def settle(self, pods: list[dict]) -> None:
        """Their create requests are done (made, or failed): the next listing tells."""
        now = time.monotonic()
        with self._lock:
            for pod in pods:
                entry = self._ledger.get(self._key(pod))
                if entry is not None:
                    entry[0] = now

    def invalidate(self) -> None:
        self._snapshot = None

    def jobs(self, namespace: str) -> list[dict]:
        """The RLTrainingJobs planning queues behind (lifecycle/fifo.py), listed with the nodes:
        all namespaces', or `namespace`'s where the operator may read only the ones it watches."""
        if self._jobs is None or self._jobs[0] != self._taken:
            try:
                self._jobs = (self._taken, None, self.api.list_jobs(None))
            except ApiError as exc:
                if exc.status != 403:
                    raise
                self._jobs = (self._taken, namespace, self.api.list_jobs(namespace))
        scope = self._jobs[1]
        return self._jobs[2] if scope is None or scope == namespace else self.api.list_jobs(namespace)


class Reconciler:
    """Applies `lifecycle.decide` to the cluster for one job at a time (thread-safe per job)."""

    def __init__(
        self,
        api: KubeAPI,
        settings: Settings = Settings(),
        metrics: Metrics | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        progress: Callable[[str | None, int], dict | None] = poll_progress,
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.progress = progress
        self._inventory_lock = threading.Lock()
        self.inventory = InventoryCache(api)
        self._writers = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="create")

    def reconcile(self, namespace: str, name: str, poll_progress: bool = False) -> Decision | None:
        """Reconcile once. Returns the decision (None: the job is gone or being deleted).

        Raises `kubeapi.Conflict` when the job changed under the decision (retry at once) and
        `kubeapi.ApiError` on other API failures (retry with backoff).
        """
        started = time.monotonic()
        action = "error"
        try:
            body = self.api.get_job(namespace, name)
            if body is None:
                action = "gone"
                self.metrics.forget_job(namespace, name)
                return None
            job = JobView.from_object(body)
            if job.deleting:
                action = "deleting"  # children go by ownerReference garbage collection
                self.metrics.forget_job(namespace, name)
                return None
            objs = [p for p in self.api.list_pods(namespace, f"{LABEL_JOB}={name}") if owned_by(p, job.ref.uid)]
            pods = pod_views(objs)
            report = (self._poll(job, pods) if poll_progress else None) or final_report(job, pods)
            kueue = self._kueue(job)
            now = self.clock()
            decision = decide(job, pods, now, None, report, self.settings, *kueue)
            try:
                decision = self._decide_and_apply(job, pods, objs, now, report, kueue, decision)
            except Rejected as refused:
                decision = self._reject(job, refused) or decision
            action = decision.action
            if decision.status is not None:
                self.metrics.observe_job(namespace, name, job.status, decision.status, job.created)
            return decision
        finally:
            self.metrics.observe_reconcile(action, time.monotonic() - started)

    def _decide_and_apply(self, job: JobView, pods: list, objs: list[dict], now: dt.datetime,
                          report: Mapping[str, Any] | None, kueue: tuple[dict | None, int | None],
                          decision: Decision) -> Decision:
        """Apply `decision`, or, when it needs the GPU inventory, decide again on it and apply that."""
        if not decision.need_cluster:
            self.apply(job, decision)
        else:
            # Planning and admission read the GPU inventory one job at a time; a plan's pods
            # enter the inventory's ledger before the lock is released, so the next plan counts
            # them even while their creates are still in flight (see InventoryCache).
            with self._inventory_lock:
                decision = self._decide_on_inventory(job, pods, objs, now, report, kueue)
                self.inventory.record([o for o in decision.create if o["kind"] == "Pod"])

            created = [o for o in decision.create if o["kind"] == "Pod"]
            try:
                self.apply(job, decision)
            except Exception:
                self.inventory.invalidate()  # what was created is unknown: list afresh
                raise
            finally:
                self.inventory.settle(created)
        return decision

    def _reject(self, job: JobView, refused: Rejected) -> Decision | None:
        """The API server refused a child (422): fail the job naming the field, in this reconcile
        (lifecycle/rejection.py). The job is read again: the decision that was being applied wrote
        its status already."""
        logger.warning("%s/%s: %s", job.namespace, job.name, refused)
        body = self.api.get_job(job.namespace, job.name)
        if body is None:
            return None
        fresh = JobView.from_object(body)
        objs = [p for p in self.api.list_pods(job.namespace, f"{LABEL_JOB}={job.name}") if owned_by(p, fresh.ref.uid)]
        decision = rejected(fresh, pod_views(objs), self.clock(), refused.kind, refused.name, refused.message,
                            self.settings)
        if decision is not None:
            self.apply(fresh, decision)
        return decision

    def _kueue(self, job: JobView) -> tuple[dict | None, int | None]:
        """(the job's Workload, the value of its priority class) for a job queued in Kueue."""
        if job.spec is None or kueue_workload.queue_of(job.ref) is None:
            return None, None
        workload = self.api.get_workload(job.namespace, kueue_workload.workload_name(job.name))
        priority = None
        if workload is None and job.spec.priority_class_name:
            priority = self.api.priority_class_value(job.spec.priority_class_name)
        return workload, priority

    def _decide_on_inventory(self, job: JobView, pods: list, objs: list[dict], now: dt.datetime,
                             report: Mapping[str, Any] | None, kueue: tuple[dict | None, int | None]) -> Decision:
        """Decide with the GPU inventory (caller holds the inventory lock).

        A decision that ends a healthy attempt because of the inventory (an elastic grow, a gang
        whose planned GPUs were taken before admission: action "replan") restarts every pod of the
        gang, so it is never taken on a cached listing: another workload's pods bound in the last
        `ttl` seconds are not in it. It is decided again on a listing taken now."""
        def on(listing: tuple[list[dict], list[dict], list[dict]]) -> Decision:
            nodes, bound, planned = listing
            cluster = cluster_view(nodes, bound, job.spec, planned, job.ref.uid, own_pods=objs,
                                   jobs=self.inventory.jobs(job.namespace))
            return decide(job, pods, now, cluster, report, self.settings, *kueue)

        decision = on(self.inventory.get())
        if decision.action == "replan" and not self.inventory.is_fresh:
            decision = on(self.inventory.get(fresh=True))
        return decision

    def _poll(self, job: JobView, pods: list) -> dict | None:
        """A fresh /progress report of the current attempt's rank 0, while it runs."""
        if job.status.get("phase") != "Running" or job.spec is None:
            return None
        rank0 = next((p for p in pods if p.index == 0 and p.attempt == int(job.status.get("attempt") or 0)), None)
        if rank0 is None or rank0.phase != "Running":
            return None
        return self.progress(rank0.pod_ip, render.progress_port(job.spec))

    def apply(self, job: JobView, decision: Decision) -> None:
        ns, name = job.namespace, job.name
        assert decision.status is not None
        patch = status_patch(job.status, decision.status)
        if patch:
            self.api.patch_job_status(ns, name, job.resource_version, patch)
        if decision.workload is not None:
            self.api.create_workload(decision.workload)
        if decision.workload_status is not None:
            self.api.patch_workload_status(ns, kueue_workload.workload_name(name), decision.workload_status)
        for pod in decision.delete:
            self.api.delete_pod(ns, pod)
        for pod in decision.force_delete:  # stranded on a lost node: no kubelet will confirm it gone
            self.api.delete_pod(ns, pod, grace_seconds=0)
        pods = [obj for obj in decision.create if obj["kind"] == "Pod"]
        for obj in decision.create:
            if obj["kind"] != "Pod":  # Service and ConfigMap first: pods mount and resolve them
                if not self._create(obj) and obj["kind"] == "ConfigMap":
                    self._refresh_configmap(obj)
        # A gang's pods are independent requests: create them concurrently (one round trip).
        list(self._writers.map(self._create, pods))
        list(self._writers.map(lambda g: self.api.remove_gate(ns, g.name, g.position, GANG_GATE, g.attempt),
                               decision.ungate))
        for event in decision.events:
            self._event(job, event.type, event.reason, event.message)
        if decision.delete_job:
            self.api.delete_job(ns, name, job.ref.uid)
        logger.debug("reconciled %s/%s: action=%s phase=%s", ns, name, decision.action, decision.status.get("phase"))
        if decision.action not in ("wait", "observe"):
            logger.info("%s/%s: %s -> %s (%s)", ns, name, decision.action,
                        decision.status.get("phase"), ", ".join(f"{e.reason}" for e in decision.events) or "-")

    def clean_checkpoints(self, job: Mapping[str, Any]) -> list[str]:
        """`job` (its last state) was deleted: create the pods that remove its hostPath checkpoint
        folders on its nodes (cleanup.py); returns their names. Errors are logged, not raised:
        nothing retries a DELETED event."""
        meta, made = job["metadata"], []
        for pod in cleanup.cleanup_pods(job, self.settings.host_path_shared):
            try:
                if self.api.create(pod):
                    made.append(pod["metadata"]["name"])
            except ApiError as exc:
                logger.warning("%s/%s: could not create checkpoint cleanup pod for node %s: %s",
                               meta["namespace"], meta["name"], pod["spec"]["nodeName"], exc)
        if made:
            logger.info("%s/%s deleted: removing its hostPath checkpoints (%s)", meta["namespace"], meta["name"],
                        ", ".join(made))
        return made

    def remove_cleanup_pod(self, pod: Mapping[str, Any]) -> bool:
        """A checkpoint cleanup pod that ended is deleted (a failed one with a warning)."""
        phase, meta = cleanup.finished(pod), pod["metadata"]
        if phase is None or meta.get("deletionTimestamp"):
            return False
        if phase == "Failed":
            logger.warning("checkpoint cleanup pod %s/%s on node %s failed: %s", meta["namespace"], meta["name"],
                           pod["spec"].get("nodeName"), (pod.get("status") or {}).get("reason") or "see its log")
        self.api.delete_pod(meta["namespace"], meta["name"], meta.get("uid"))
        return True

    def _create(self, obj: dict[str, Any]) -> bool:
        try:
            return self.api.create(obj)
        except ApiError as exc:
            if exc.status == 422:
                raise Rejected(obj["kind"], obj["metadata"]["name"], exc.message) from exc
            raise

    def _refresh_configmap(self, obj: dict[str, Any]) -> None:
        """A ConfigMap of that name exists: rewrite run.yaml when the spec changed it."""
        meta = obj["metadata"]
        existing = self.api.get("ConfigMap", meta["namespace"], meta["name"])
        if existing is not None and (existing.get("data") or {}) != obj["data"]:
            self.api.patch_configmap_data(meta["namespace"], meta["name"], obj["data"])

    def _event(self, job: JobView, type_: str, reason: str, message: str) -> None:
        involved = {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "namespace": job.namespace,
                    "uid": job.ref.uid}
        try:
            self.api.post_event(involved, type_, reason, message)
        except Exception as exc:  # an Event is information, never a reason to redo a decision
            logger.warning("%s/%s: could not post Event %s: %s", job.namespace, job.name, reason, exc)
