"""Kueue admits RLTrainingJob gangs as Workloads: real API server, real Kueue (tests/cluster/kueue.py).

The Workloads are made by `rlkube.operator.render.kueue_workload`, the functions the operator uses, for
RLTrainingJob objects created through the API (no operator runs here: these tests pin the
contract with Kueue). A ClusterQueue with 2 `nvidia.com/gpu` (and cpu/memory, which Kueue needs
covered for every resource a pod requests) and a LocalQueue in the test namespace.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from rlkube.operator.api import parse_spec
from rlkube.operator.api.observed import JobRef
from rlkube.operator.controller.kubeapi import ApiError
from rlkube.operator.render import kueue_workload as kw
from tests.cluster import procs
from tests.integration.operator_env import Env, tiny_spec, wait_until

pytestmark = pytest.mark.integration

KUEUE_API = f"/apis/{kw.GROUP}/{kw.VERSION}"
MERGE = "application/merge-patch+json"
# one pod of 2 GPUs (the reference shares the actor's)
GANG = tiny_spec(2, placement={"gpusPerPod": 2}, resources={"requests": {"cpu": "1", "memory": "1Gi"}})


class Queues:
    """The test's ResourceFlavor, ClusterQueue, LocalQueue and PriorityClasses (cluster-scoped
    names carry the namespace's suffix, so parallel sessions never share them)."""

    def __init__(self, env: Env) -> None:
        self.env, self.api = env, env.api
        suffix = env.namespace.rsplit("-", 1)[1]
        self.flavor, self.cluster_queue, self.local_queue = f"rlk-{suffix}", f"rlk-{suffix}", "gpus"
        self.priorities = {"low": (f"rlk-{suffix}-low", 10), "high": (f"rlk-{suffix}-high", 1000)}

    def create(self) -> None:
        post = self.api.request
        post("POST", f"{KUEUE_API}/resourceflavors", body={
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "ResourceFlavor", "metadata": {"name": self.flavor}})
        quota = [{"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "64Gi"},
                 {"name": "nvidia.com/gpu", "nominalQuota": "2"}]
        post("POST", f"{KUEUE_API}/clusterqueues", body={
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "ClusterQueue", "metadata": {"name": self.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.env.namespace}},
                "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                    "flavors": [{"name": self.flavor, "resources": quota}]}],
                "preemption": {"withinClusterQueue": "LowerPriority"},
            },
        })  # fmt: skip
        post("POST", f"{KUEUE_API}/namespaces/{self.env.namespace}/localqueues", body={
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "LocalQueue",
            "metadata": {"name": self.local_queue, "namespace": self.env.namespace},
            "spec": {"clusterQueue": self.cluster_queue}})
        for name, value in self.priorities.values():
            post("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body={
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value})
        wait_until("the ClusterQueue Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (self.cluster_queue_status().get("conditions") or [])), 60)

    def cluster_queue_status(self) -> dict:
        return self.api.request("GET", f"{KUEUE_API}/clusterqueues/{self.cluster_queue}").get("status") or {}

    def delete(self) -> None:
        paths = [f"{KUEUE_API}/namespaces/{self.env.namespace}/localqueues/{self.local_queue}",
                 f"{KUEUE_API}/clusterqueues/{self.cluster_queue}", f"{KUEUE_API}/resourceflavors/{self.flavor}"]
        paths += [f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}" for name, _ in self.priorities.values()]
        for path in paths:
            try:
                self.api.request("DELETE", path)
                # Kueue holds the queue and flavor until nothing uses them (its finalizer): wait, so
                # none is left Terminating once Kueue stops.
                wait_until(f"{path} deleted", lambda p=path: self._gone(p), 60)
            except ApiError as exc:
                if exc.status != 404:
                    raise

    def _gone(self, path: str) -> bool:
        try:
            self.api.request("GET", path)
        except ApiError as exc:
            return exc.status == 404
        return False


@pytest.fixture(scope="module")
def env(kueue):
    e = Env(kueue.kubeconfig, kueue.kubectl, prefix="kq")
    e.install_crd()
    e.create_namespace()
    e.layout = kueue.layout
    e.queues = Queues(e)
    e.queues.create()
    yield e
    e.queues.delete()
    e.teardown()


@pytest.fixture(autouse=True)
def kueue_log_and_clean_up(request, env):
    """On failure print Kueue's log; always delete the test's jobs and Workloads (their quota
    goes back, so the next test starts with an empty ClusterQueue)."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print("\n--- kueue log (tail) ---\n" + procs.log_tail(env.layout.state, "kueue", 80))
    for job in env.api.list_jobs(env.namespace):
        env.delete_job(job["metadata"]["name"])
    workloads = f"{KUEUE_API}/namespaces/{env.namespace}/workloads"
    for workload in env.api.request("GET", workloads)["items"]:
        try:
            env.api.request("DELETE", f"{workloads}/{workload['metadata']['name']}")
        except ApiError as exc:
            if exc.status != 404:  # garbage collection, following its job, may delete it first
                raise
    wait_until("the test's Workloads deleted", lambda: not env.api.request("GET", workloads)["items"], 60)


def queued_job(env: Env, name: str, priority: str | None = None) -> tuple[JobRef, dict]:
    """An RLTrainingJob labelled with the test's LocalQueue, and the Workload the operator makes for it."""
    spec = json.loads(json.dumps(GANG))
    value = None
    if priority:
        spec["priorityClassName"], value = env.queues.priorities[priority]
    body = env.job_body(name, spec)
    body["metadata"]["labels"] = {kw.QUEUE_LABEL: env.queues.local_queue}
    created = env.api.request("POST", f"/apis/rlkube.io/v1alpha1/namespaces/{env.namespace}/rltrainingjobs", body=body)
    meta = created["metadata"]
    job = JobRef(meta["name"], meta["namespace"], meta["uid"], labels=meta["labels"])
    queue = kw.queue_of(job)
    assert queue == env.queues.local_queue
    workload = kw.render_workload(job, parse_spec(created["spec"]), queue, priority=value)
    env.api.request("POST", f"{KUEUE_API}/namespaces/{env.namespace}/workloads", body=workload)
    return job, workload


def workload_path(env: Env, job: JobRef) -> str:
    return f"{KUEUE_API}/namespaces/{env.namespace}/workloads/{kw.workload_name(job.name)}"


def observed(env: Env, job: JobRef) -> kw.WorkloadState:
    return kw.observe_workload(env.api.request("GET", workload_path(env, job)))


def write_status(env: Env, job: JobRef, make_patch) -> None:
    """Apply a status patch built from a fresh read (the patch carries its resourceVersion)."""
    current = env.api.request("GET", workload_path(env, job))
    env.api.request("PATCH", workload_path(env, job) + "/status", body=make_patch(current), content_type=MERGE)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def waits_for_gpu_quota(env: Env, job: JobRef):
    def check():
        state = observed(env, job)
        # Kueue tried and refused for want of GPUs (QuotaReserved False, its reason in the message).
        return not state.quota_reserved and "nvidia.com/gpu" in state.message and state
    return check


def test_second_gang_waits_for_gpu_quota_until_the_first_finishes(env):
    first, _ = queued_job(env, "first")
    state = wait_until("the first Workload admitted", lambda: observed(env, first).admitted and observed(env, first), 60)
    assert state.cluster_queue == env.queues.cluster_queue and state.admitted_pods == 1

    second, _ = queued_job(env, "second")
    waiting = wait_until("the second Workload refused for GPU quota", waits_for_gpu_quota(env, second), 60)
    assert not waiting.admitted and waiting.waiting_message().startswith(
        f"waiting for Kueue admission in queue {env.queues.local_queue}: ")
    # Kueue writes the ClusterQueue's counters on its own schedule, after the Workloads'.
    wait_until("the ClusterQueue counting 1 admitted and 1 pending", lambda: (
        (lambda u: (u.get("admittedWorkloads"), u.get("pendingWorkloads")) == (1, 1))(
            env.queues.cluster_queue_status())), 30, diagnose=lambda: str(env.queues.cluster_queue_status()))
    assert not observed(env, first).evicted   # equal priority: no preemption

    write_status(env, first, lambda wl: kw.finish_patch(wl, succeeded=True, message="all 1 pods succeeded", now=now()))
    assert observed(env, first).finished
    wait_until("the second Workload admitted once the first finished",
               lambda: observed(env, second).admitted, 60)


def test_preempted_gang_hands_its_quota_back_and_queues_again(env):
    low, _ = queued_job(env, "low", priority="low")
    wait_until("the low-priority Workload admitted", lambda: observed(env, low).admitted, 60)

    high, _ = queued_job(env, "high", priority="high")
    evicted = wait_until("the low-priority Workload evicted", lambda: observed(env, low).evicted and observed(env, low),
                         60)
    assert evicted.reason == "Preempted", evicted
    # Kueue waits for the owner to stop the gang and release the quota (as for its own job kinds).
    assert not observed(env, high).admitted

    write_status(env, low, lambda wl: kw.release_patch(wl, now()))
    wait_until("the high-priority Workload admitted", lambda: observed(env, high).admitted, 60)
    requeued = wait_until("the low-priority Workload queued again", waits_for_gpu_quota(env, low), 60)
    assert not requeued.admitted and requeued.cluster_queue is None

    write_status(env, high, lambda wl: kw.finish_patch(wl, succeeded=True, message="done", now=now()))
    state = wait_until("the low-priority Workload admitted again", lambda: observed(env, low).admitted
                       and observed(env, low), 60)
    assert state.admitted_pods == 1
