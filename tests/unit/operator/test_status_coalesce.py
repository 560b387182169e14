"""A status change that only updates pod counts ("3/4 pods bound") is written at most once per
`Settings.status_coalesce_seconds` per job, and the latest counts when the interval ends (the
decision asks to be requeued then); phase, reasons, placement and anything with an action are
written at once (reconcile.py, status.counts_only)."""

from __future__ import annotations

import copy

from operator_builders import node
from test_cluster_state import eight_gpu_job, synced
from test_store_reads import CountingCluster, deliver_pods

from rlkube.operator import lifecycle
from rlkube.operator.controller.cluster_state import WatchedInventory
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.render.status import counts_only


class WritingCluster(CountingCluster):
    def __init__(self, jobs):
        super().__init__(jobs)
        self.status_writes = 0

    def patch_job_status(self, namespace, name, resource_version, patch):
        self.status_writes += 1
        return super().patch_job_status(namespace, name, resource_version, patch)


def world(window: float):
    job = eight_gpu_job("j1")
    api = WritingCluster([job])
    inventory = synced(WatchedInventory(api))
    inventory.nodes.replace([node("n1", 8), node("n2", 8)])
    inventory.pods.replace([])
    inventory.jobs_by_ns[0].replace([copy.deepcopy(job)])
    settings = lifecycle.Settings(host_path_shared=True, status_coalesce_seconds=window)
    return api, inventory, Reconciler(api, settings, progress=lambda ip, port: None, inventory=inventory)


def bind(api, inventory, count: int) -> None:
    """The first `count` pods bound to their planned nodes (as the watch delivers them)."""
    for name in sorted(api.pods)[:count]:
        pod = api.pods[name]
        pod["spec"]["nodeName"] = pod["metadata"]["annotations"]["rlkube.io/planned-node"]
        inventory.pods.apply("MODIFIED", copy.deepcopy(pod))


def progress_message(api) -> str:
    return next(c["message"] for c in api.jobs["j1"]["status"]["conditions"] if c["type"] == "Progressing")


def one_pod_bound(interval: float):
    """A job created, its pods delivered by the watch and one of them bound; the status writes so far."""
    api, inventory, reconciler = world(interval)
    reconciler.reconcile("team", "j1")
    deliver_pods(api, inventory)
    writes = api.status_writes
    bind(api, inventory, 1)
    return api, inventory, reconciler, writes


def test_counts_alone_wait_for_the_interval_then_the_latest_is_written():
    api, inventory, reconciler, writes = one_pod_bound(5.0)
    first = reconciler.reconcile("team", "j1")
    assert first.status["phase"] == "Scheduling" and "1/4 pods bound" in first.status["conditions"][2]["message"]
    assert api.status_writes == writes and 0 < first.requeue_after <= 5.0  # held back, and asked back
    bind(api, inventory, 3)
    reconciler._written_at[("team", "j1")] -= 10  # the interval has passed
    later = reconciler.reconcile("team", "j1")
    assert api.status_writes == writes + 1 and progress_message(api) == "3/4 pods bound"
    assert later.requeue_after > 5.0  # the gang timeout's, no longer the interval's


def test_without_an_interval_every_change_is_written():
    api, _, reconciler, writes = one_pod_bound(0.0)
    reconciler.reconcile("team", "j1")
    assert api.status_writes == writes + 1 and progress_message(api) == "1/4 pods bound"


def test_a_change_of_phase_or_reason_is_not_held_back():
    base = {"phase": "Scheduling", "conditions": [
        {"type": "Progressing", "status": "True", "reason": "Admitted", "message": "1/4 pods bound",
         "lastTransitionTime": "t0"}], "roles": {"actor": {"readyPods": 0}}}
    counts = copy.deepcopy(base)
    counts["conditions"][0]["message"] = "3/4 pods bound"
    counts["roles"]["actor"]["readyPods"] = 2
    assert counts_only(base, counts)
    for change in (("phase", "Running"), ("attempt", 1), ("admissionTime", "t1")):
        other = copy.deepcopy(counts)
        other[change[0]] = change[1]
        assert not counts_only(base, other), change
    reason = copy.deepcopy(counts)
    reason["conditions"][0]["reason"] = "PodsStarting"
    assert not counts_only(base, reason)
    assert not counts_only(base, base)  # nothing to write is not a write held back
