"""One reconcile of one job: fetch, decide (pure), write. Synchronous; runs on a worker thread.

`Reconciler.reconcile(namespace, name)` reads the job and its pods from the inventory's watch
stores where they answer safely, else fresh from the API server (cluster_state.py says when; a
restarted operator's stores are listed before its first reconcile), calls `lifecycle.decide`, takes the GPU inventory (cluster_state.py: kept by watches in the
operator) only when the decision needs it, and applies the decision in the order that keeps every crash recoverable:

1. status (merge patch with the job's resourceVersion: a stale decision fails with Conflict and
   is recomputed, never recorded); a child the API server refuses as invalid (422) fails the job
   in the same reconcile (lifecycle/rejection.py);
2. a queued job's Kueue Workload: created, or its status written (release, finish);
   then pod deletions (grace 0 for pods stranded on a lost node);
3. creations (AlreadyExists is success: names are deterministic); a job's environment
   (roles.environment: a Deployment and a Service) is made, scaled and reported before the status
   write (environment_sync.py);
4. gate removals (JSON patch with `test` ops: only that attempt's pod, only our gate);
5. Events (in the background); 6. deleting the job itself (ttlSecondsAfterFinished, with a uid precondition).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlkube.operator import render
from rlkube.operator.api import API_VERSION, KIND
from rlkube.operator.api.observed import GANG_GATE, LABEL_JOB, JobView, gang_gated, owned_by, pod_views
from rlkube.operator.controller.cluster_state import ListedInventory, PlanningTurns, WatchedInventory
from rlkube.operator.controller.environment_sync import sync_environment
from rlkube.operator.controller.kubeapi import ApiError, Conflict, KubeAPI, delete_configmap
from rlkube.operator.controller.metrics import Metrics
from rlkube.operator.controller.progress_client import poll_progress
from rlkube.operator.lifecycle import Decision, Settings, decide
from rlkube.operator.lifecycle.rejection import rejected
from rlkube.operator.planning.cluster import cluster_view_of
from rlkube.operator.render import cleanup, kueue_workload
from rlkube.operator.render.status import counts_only, status_patch
from rlkube.runtime.contract.pod import LABEL_ATTEMPT

logger = logging.getLogger("rlkube.operator")

EVENT_LANES = 4


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


def held_back(window: float, written_at: float | None, job: JobView, decision: Decision) -> float | None:
    """Seconds to hold back `decision`'s status write: only when it changes pod counts alone
    (status.counts_only), does nothing else, and the job's status was written (at monotonic time
    `written_at`) less than `window` seconds ago. A gang binding and starting changed its counts
    several times a second, each a status write (issue 20's 17:00 run: 2.7 such writes per job)."""
    if window <= 0 or written_at is None or decision.create or decision.delete or decision.force_delete \
            or decision.ungate or decision.events or decision.delete_job or decision.workload is not None \
            or decision.workload_status is not None or not counts_only(job.status, decision.status or {}):
        return None
    left = window - (time.monotonic() - written_at)
    return left if left > 0 else None


def _named(namespace: str, name: str, attempt: int) -> dict:
    """What a pod's gate removal needs to know of it when the API server's answer had no body."""
    return {"metadata": {"namespace": namespace, "name": name, "labels": {LABEL_ATTEMPT: str(attempt)}}}


class Rejected(Exception):
    """The API server refused to create a child as invalid (422): retrying cannot help."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"the API server refused {kind} {name}: {message}")
        self.kind, self.name, self.message = kind, name, message


class Reconciler:
    """Applies `lifecycle.decide` to the cluster for one job at a time (thread-safe per job)."""

    def __init__(
        self,
        api: KubeAPI,
        settings: Settings = Settings(),
        metrics: Metrics | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        progress: Callable[[str | None, int], dict | None] = poll_progress,
        inventory: WatchedInventory | ListedInventory | None = None,
        background_events: bool = False,
    ) -> None:
        self.api = api
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.progress = progress
        self._planning = PlanningTurns()  # oldest job first (cluster_state.py says why)
        self._own_versions: dict[tuple[str, str], str] = {}  # job -> resourceVersion of our last status write
        self._read_fresh: set[tuple[str, str]] = set()  # jobs whose next reconcile reads the API, not the stores
        self._written_at: dict[tuple[str, str], float] = {}  # job -> when its status was last written (monotonic)
        # The operator passes a started WatchedInventory (main.py); without one, listings.
        self.inventory = inventory if inventory is not None else ListedInventory(api)
        # Shared by every reconcile's creates and gate removals: at 16 reconciles at once, a 16-thread
        # pool queued one job's gang behind another's (issue 20's profile); the API client keeps 64
        # connections (kubeapi.py), enough for these, the reconcile workers and the watches.
        self._writers = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="create")
        # Events posted off the reconcile's path (the operator): one thread per lane, a job always
        # on the same lane, so its Events keep their order.
        self._event_lanes = [concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"event{i}")
                             for i in range(EVENT_LANES if background_events else 0)]

    def own_write(self, key: tuple[str, str], resource_version: str | None) -> bool:
        """Whether a watch event of job `key` at `resource_version` is the echo of this operator's
        last status write of it (the version that write returned)."""
        return bool(resource_version) and self._own_versions.get(key) == resource_version

    def reconcile(self, namespace: str, name: str, poll_progress: bool = False) -> Decision | None:
        """Reconcile once. Returns the decision (None: the job is gone or being deleted).

        Raises `kubeapi.Conflict` when the job changed under the decision (retry at once) and
        `kubeapi.ApiError` on other API failures (retry with backoff).
        """
        started = time.monotonic()
        action = "error"
        try:
            body, listing = self._read(namespace, name)
            if body is None:
                action = "gone"
                self.metrics.forget_job(namespace, name)
                self._own_versions.pop((namespace, name), None)
                self._written_at.pop((namespace, name), None)
                return None
            job = JobView.from_object(body)
            if job.deleting:
                action = "deleting"  # children go by ownerReference garbage collection
                self.metrics.forget_job(namespace, name)
                return None
            objs = [p for p in listing.result() if owned_by(p, job.ref.uid)]
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
        except Conflict:
            self._read_fresh.add((namespace, name))  # the store may be behind: the retry reads the API
            raise
        finally:
            self.metrics.observe_reconcile(action, time.monotonic() - started)

    def _read(self, namespace: str, name: str) -> tuple[dict | None, Any]:
        """The job and (a future of) its pods: from the inventory's watch stores where they answer
        (cluster_state.py says when they do not), else from the API server, both at once (two
        requests, one round trip)."""
        fresh = (namespace, name) in self._read_fresh
        self._read_fresh.discard((namespace, name))
        pods = None if fresh else self.inventory.job_pods(namespace, name)
        listing = concurrent.futures.Future()
        if pods is None:
            listing = self._writers.submit(self.api.list_pods, namespace, f"{LABEL_JOB}={name}")
        else:
            listing.set_result(pods)
        body = None if fresh else self.inventory.job_object(namespace, name)
        return body if body is not None else self.api.get_job(namespace, name), listing

    def _decide_and_apply(self, job: JobView, pods: list, objs: list[dict], now: dt.datetime,
                          report: Mapping[str, Any] | None, kueue: tuple[dict | None, int | None],
                          decision: Decision) -> Decision:
        """Apply `decision`, or, when it needs the GPU inventory, decide again on it and apply that."""
        if not decision.need_cluster:
            return self.apply(job, decision)
        # Planning and admission read the GPU inventory one job at a time; a plan's pods
        # enter the inventory's ledger before the lock is released, so the next plan counts
        # them even while their creates are still in flight (cluster_state.Ledger).
        with self._planning.turn((job.created, job.name, job.namespace)):
            decision = self._decide_on_inventory(job, pods, objs, now, report, kueue)
            self.inventory.record([o for o in decision.create if o["kind"] == "Pod"])

        created = [o for o in decision.create if o["kind"] == "Pod"]
        try:
            return self.apply(job, decision)
        except Exception:
            self.inventory.invalidate()  # what was created is unknown: list afresh
            raise
        finally:
            self.inventory.settle(created)

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
        `ttl` seconds (or not yet delivered by the watch) are not in it. It is decided again on a
        listing taken now."""
        def on(fresh: bool) -> Decision:
            cluster = cluster_view_of(self.inventory.snapshot(job.namespace, fresh), job.spec, job.ref.uid,
                                      own_pods=objs)
            return decide(job, pods, now, cluster, report, self.settings, *kueue)

        decision = on(False)
        if decision.action == "replan" and not self.inventory.is_fresh:
            decision = on(True)
        return decision

    def _poll(self, job: JobView, pods: list) -> dict | None:
        """A fresh /progress report of the current attempt's rank 0, while it runs."""
        if job.status.get("phase") != "Running" or job.spec is None:
            return None
        rank0 = next((p for p in pods if p.index == 0 and p.attempt == int(job.status.get("attempt") or 0)), None)
        if rank0 is None or rank0.phase != "Running":
            return None
        return self.progress(rank0.pod_ip, render.progress_port(job.spec))

    def apply(self, job: JobView, decision: Decision) -> Decision:
        """Apply `decision`; returns it, or it with an earlier requeue when its status write was
        held back (`held_back`), so the latest counts are written when the interval ends."""
        ns, name = job.namespace, job.name
        assert decision.status is not None
        decision = sync_environment(self.api, job, decision, self._create)
        deferred = held_back(self.settings.status_coalesce_seconds, self._written_at.get((ns, name)), job, decision)
        if deferred is not None:
            return replace(decision, requeue_after=min(deferred, decision.requeue_after or deferred))
        patch = status_patch(job.status, decision.status)
        if patch:
            written = self.api.patch_job_status(ns, name, job.resource_version, patch)
            self._written_at[(ns, name)] = time.monotonic()
            self._own_versions[(ns, name)] = str(((written or {}).get("metadata") or {}).get("resourceVersion") or "")
            self.inventory.wrote_job(job.resource_version, written)
        if decision.workload is not None:
            self.api.create_workload(decision.workload)
        if decision.workload_status is not None:
            self.api.patch_workload_status(ns, kueue_workload.workload_name(name), decision.workload_status)
        for pod in decision.delete:
            self.api.delete_pod(ns, pod)
        for pod in decision.force_delete:  # stranded on a lost node: no kubelet will confirm it gone
            self.api.delete_pod(ns, pod, grace_seconds=0)
        # Service, ConfigMap and the gang's pods are independent requests, made concurrently (one
        # round trip) when our gate holds every pod until all creates succeeded: none can start
        # before the ConfigMap it mounts and the Service it resolves exist. Pods not gated by us
        # (Kueue, Volcano) are created after those. Then the gates, concurrently.
        pods = [obj for obj in decision.create if obj["kind"] == "Pod"]
        # Where the hostPath checkpoints will be, kept apart from the job (cleanup.py): created with
        # the pods, before any can start, so a job deleted while no operator runs is still cleaned.
        record = cleanup.record(job, decision.status) if pods else None
        create = [*decision.create, record] if record else decision.create
        if all(gang_gated(obj) for obj in pods):
            list(self._writers.map(self._create_child, create))
        else:
            list(self._writers.map(self._create_child, [obj for obj in create if obj["kind"] != "Pod"]))
            list(self._writers.map(self._create_child, pods))
        for gate, patched in zip(decision.ungate, self._writers.map(
                lambda g: self.api.remove_gate(ns, g.name, g.position, GANG_GATE, g.attempt), decision.ungate),
                strict=True):
            if patched is not None:  # until the pod watch shows it, the store's gated copy reads as ungated
                self.inventory.gate_removed(patched if patched.get("metadata") else _named(ns, gate.name, gate.attempt))
        self._post_events(job, decision.events)
        if decision.delete_job:
            self.api.delete_job(ns, name, job.ref.uid)
        logger.debug("reconciled %s/%s: action=%s phase=%s", ns, name, decision.action, decision.status.get("phase"))
        if decision.action not in ("wait", "observe"):
            logger.info("%s/%s: %s -> %s (%s)", ns, name, decision.action,
                        decision.status.get("phase"), ", ".join(f"{e.reason}" for e in decision.events) or "-")
        return decision

    def clean_checkpoints(self, job: Mapping[str, Any]) -> list[str]:
        """`job` (its last state, or what its checkpoint record says) was deleted: create the pods
        that remove its hostPath checkpoint folders on its nodes (cleanup.py), then delete its
        record; returns the pods' names. Errors are logged, not raised: a record left behind is
        retried by the sweep (checkpoint_sweep.py)."""
        meta, made, failed = job["metadata"], [], False
        for pod in cleanup.cleanup_pods(job, self.settings.host_path_shared):
            try:
                if self.api.create(pod):
                    made.append(pod["metadata"]["name"])
            except ApiError as exc:
                failed = True
                logger.warning("%s/%s: could not create checkpoint cleanup pod for node %s: %s",
                               meta["namespace"], meta["name"], pod["spec"]["nodeName"], exc)
        if not failed and meta.get("uid"):
            try:
                delete_configmap(self.api, meta["namespace"], cleanup.record_name(meta["name"], meta["uid"]))
            except ApiError as exc:
                logger.warning("%s/%s: could not delete its checkpoint record: %s", meta["namespace"], meta["name"], exc)
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

    def _create_child(self, obj: dict[str, Any]) -> None:
        if not self._create(obj) and obj["kind"] == "ConfigMap":  # exists: rewrite it if the spec changed
            self._refresh_configmap(obj)

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

    def _post_events(self, job: JobView, events: Sequence[Any]) -> None:
        if not self._event_lanes:
            for event in events:
                self._event(job, event.type, event.reason, event.message)
        elif events:  # information, not a step of the decision: the reconcile does not wait for it
            lane = self._event_lanes[zlib.crc32(job.ref.uid.encode()) % len(self._event_lanes)]
            lane.submit(lambda: [self._event(job, e.type, e.reason, e.message) for e in events])

    def _event(self, job: JobView, type_: str, reason: str, message: str) -> None:
        involved = {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "namespace": job.namespace,
                    "uid": job.ref.uid}
        try:
            self.api.post_event(involved, type_, reason, message)
        except Exception as exc:  # an Event is information, never a reason to redo a decision
            logger.warning("%s/%s: could not post Event %s: %s", job.namespace, job.name, reason, exc)
