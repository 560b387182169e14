"""A reconcile reads its job and the job's pods from the inventory's watch stores (cluster_state.py)
where they answer safely, and from the API server where they may be behind: a job not in the
store, a job whose status write met a Conflict, a job with a pod the operator created that the
store does not show yet. Its own status write is in the store at once."""

from __future__ import annotations

import copy

import pytest
from operator_builders import node
from test_cluster_state import FakeCluster, eight_gpu_job, synced

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import PodView
from rlkube.operator.controller.cluster_state import JobStore, WatchedInventory, reduce_job_pod
from rlkube.operator.controller.kubeapi import Conflict
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.planning.inventory import pod_use


class CountingCluster(FakeCluster):
    """FakeCluster that counts reads, returns the written job with a new resourceVersion like the API
    server, and answers a status write over a stale resourceVersion with a Conflict."""

    def __init__(self, jobs):
        super().__init__(jobs)
        self.reads = {"get_job": 0, "list_pods": 0}
        self.as_created: dict[str, dict] = {}  # pod -> the pod as created (gated): what a lagging watch shows
        self.gate_removals = 0

    def create(self, obj):
        if obj["kind"] == "Pod":
            obj = copy.deepcopy(obj)
            obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
            self.as_created[obj["metadata"]["name"]] = copy.deepcopy(obj)
        return super().create(obj)

    def remove_gate(self, namespace, name, position, gate, attempt):
        self.gate_removals += 1
        return super().remove_gate(namespace, name, position, gate, attempt)

    def get_job(self, namespace, name):
        self.reads["get_job"] += 1
        return super().get_job(namespace, name)

    def list_pods(self, namespace, selector):
        self.reads["list_pods"] += 1
        return super().list_pods(namespace, selector)

    def patch_job_status(self, namespace, name, resource_version, patch):
        job = self.jobs[name]
        if job["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(409, "Conflict", "the object has been modified")
        super().patch_job_status(namespace, name, resource_version, patch)
        job["metadata"]["resourceVersion"] = str(int(resource_version) + 1)
        return copy.deepcopy(job)


def world(*names):
    jobs = [eight_gpu_job(n) for n in names]
    api = CountingCluster(jobs)
    inventory = synced(WatchedInventory(api))
    inventory.nodes.replace([node("n1", 8), node("n2", 8)])
    inventory.pods.replace([])
    inventory.jobs_by_ns[0].replace(copy.deepcopy(jobs))
    reconciler = Reconciler(api, lifecycle.Settings(host_path_shared=True), progress=lambda ip, port: None,
                            inventory=inventory)
    return api, inventory, reconciler


def deliver_pods(api, inventory):
    for obj in api.pods.values():
        inventory.pods.apply("ADDED", copy.deepcopy(obj))


def test_a_gang_just_created_is_listed_until_the_watch_shows_it_then_read_from_the_store():
    api, inventory, reconciler = world("j1")
    assert reconciler.reconcile("team", "j1").action == "create"
    assert api.reads == {"get_job": 0, "list_pods": 0}  # the job and its (no) pods: from the stores
    # Its own status write is in the store: the next reconcile does not decide on the version before it.
    assert inventory.job_object("team", "j1")["status"]["phase"] == api.jobs["j1"]["status"]["phase"]
    assert inventory.job_pods("team", "j1") is None  # created, not in the store yet: expectations
    again = reconciler.reconcile("team", "j1")
    assert api.reads["list_pods"] == 1 and again.action == "wait" and not again.create  # not made twice
    deliver_pods(api, inventory)
    assert len(inventory.job_pods("team", "j1")) == 4
    before = dict(api.reads)
    reconciler.reconcile("team", "j1")
    assert api.reads == before  # all from the stores now


def test_a_conflict_makes_the_next_reconcile_read_the_api_server():
    api, inventory, reconciler = world("j1")
    api.jobs["j1"]["metadata"]["resourceVersion"] = "150"  # changed by someone; the watch is behind
    with pytest.raises(Conflict):
        reconciler.reconcile("team", "j1")
    assert api.reads["get_job"] == 0
    assert reconciler.reconcile("team", "j1").action == "create"  # on the API server's version
    assert api.reads["get_job"] == 1 and api.jobs["j1"]["metadata"]["resourceVersion"] == "151"


def test_a_job_the_store_does_not_hold_is_read_from_the_api_server():
    api, inventory, reconciler = world("j1")
    inventory.jobs_by_ns[0].replace([])
    reconciler.reconcile("team", "j1")
    assert api.reads["get_job"] == 1


def test_the_store_takes_a_write_only_over_the_version_that_was_read():
    store = JobStore()
    job = eight_gpu_job("j1")
    store.replace([copy.deepcopy(job)])
    newer = copy.deepcopy(job)
    newer["metadata"]["resourceVersion"] = "101"
    written = copy.deepcopy(job)
    written["metadata"]["resourceVersion"] = "102"
    store.wrote("100", written)
    assert store.objects[("team", "j1")]["metadata"]["resourceVersion"] == "102"
    store.apply("MODIFIED", newer)  # an older event arriving late is the watch's to order, not ours
    stale_write = copy.deepcopy(job)
    stale_write["metadata"]["resourceVersion"] = "103"
    store.wrote("100", stale_write)  # read 100, but the store moved on since: keep the store's
    assert store.objects[("team", "j1")]["metadata"]["resourceVersion"] == "101"


def test_a_reduced_pod_reads_as_the_full_one():
    full = {"metadata": {"name": "j1-actor-0", "namespace": "team", "uid": "p1", "labels": {
                "rlkube.io/job": "j1", "rlkube.io/attempt": "0", "rlkube.io/pod-index": "0"},
                "annotations": {"rlkube.io/planned-node": "n1", "rlkube.io/gpus": "2"},
                "ownerReferences": [{"uid": "uid-j1"}], "managedFields": [{"manager": "x"}] * 5,
                "deletionTimestamp": "2026-12-04T00:00:09Z"},
            "spec": {"nodeName": "n1", "schedulingGates": [{"name": "rlkube.io/gang"}], "volumes": [{"name": "v"}],
                     "containers": [{"name": "trainer", "image": "i", "env": [{"name": "A", "value": "1"}],
                                     "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
                     "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Failed", "reason": "Evicted", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "False"}],
                       "containerStatuses": [{"name": "trainer", "state": {"terminated": {
                           "exitCode": 3, "message": '{"error": {"exit": "config", "message": "bad"}}'}}}]}}
    reduced = reduce_job_pod(full)
    assert pod_use(reduced) == pod_use(full)
    assert PodView.from_object(reduced) == PodView.from_object(full).__class__(
        **{**PodView.from_object(full).__dict__, "raw": reduced})
    assert "managedFields" not in reduced["metadata"] and "volumes" not in reduced["spec"]


def test_gates_removed_are_not_removed_again_while_the_watch_still_shows_them():
    api, inventory, reconciler = world("j1")
    assert reconciler.reconcile("team", "j1").action == "create"
    assert api.gate_removals == 4
    for obj in api.as_created.values():  # the watch delivers the creates; the removals lag behind
        inventory.pods.apply("ADDED", copy.deepcopy(obj))
    assert all(not p["spec"]["schedulingGates"] for p in inventory.job_pods("team", "j1"))
    again = reconciler.reconcile("team", "j1")
    assert api.gate_removals == 4 and again.action != "ungate" and not again.ungate
    assert again.status["phase"] == "Scheduling"
    deliver_pods(api, inventory)  # the removals arrive: nothing is expected any more
    assert inventory.pods.ungated == {}


def test_a_pod_made_again_under_the_same_name_reads_as_the_store_has_it():
    api, inventory, reconciler = world("j1")
    reconciler.reconcile("team", "j1")
    for obj in api.as_created.values():
        inventory.pods.apply("ADDED", copy.deepcopy(obj))
    name = sorted(api.as_created)[0]
    other = copy.deepcopy(api.as_created[name])
    other["metadata"]["uid"] = "another-uid"  # deleted and created again, gated: not the pod ungated
    inventory.pods.apply("ADDED", other)
    (pod,) = [p for p in inventory.job_pods("team", "j1") if p["metadata"]["name"] == name]
    assert pod["spec"]["schedulingGates"] == [{"name": "rlkube.io/gang"}]
    inventory.pods.apply("DELETED", other)
    assert (("team", name)) not in inventory.pods.ungated
