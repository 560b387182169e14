"""The Kueue Workload of a queued job: what it asks for, what Kueue wrote, what the operator writes."""

from __future__ import annotations

import datetime as dt

import pytest
from operator_builders import spec

from rlkube.operator.api import parse_spec
from rlkube.operator.api.observed import JobRef
from rlkube.operator.render import kueue_workload as kw

T0 = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.timezone.utc)
JOB = JobRef("tiny", "team", "u-1", labels={"kueue.x-k8s.io/queue-name": "gpu-team"})


def gang_spec(**overrides):
    """DPO, actor 4 GPUs (the reference colocated), 2 per pod: a gang of 2 pods of 2 GPUs."""
    return parse_spec(spec("dpo", gpus_per_pod=2, roles={"actor": {"gpus": 4}, "reference": {"colocateWith": "actor"}},
                           **overrides))


def workload(**overrides):
    s = gang_spec(**overrides)
    return kw.render_workload(JOB, s, "gpu-team")


def cond(kind: str, status: bool, reason: str = "R", message: str = "", at: str = "2026-12-03T11:00:00Z") -> dict:
    return {"type": kind, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": at, "observedGeneration": 1}


def with_status(obj: dict, *conditions: dict, admission: dict | None = None) -> dict:
    out = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "42", "generation": 1}}
    out["status"] = {"conditions": list(conditions), **({"admission": admission} if admission else {})}
    return out


@pytest.mark.parametrize("labels, queue", [
    ({"kueue.x-k8s.io/queue-name": "gpu-team"}, "gpu-team"),
    ({"kueue.x-k8s.io/queue-name": ""}, None),
    ({}, None),
    (None, None),
])
def test_queue_comes_from_the_label(labels, queue):
    assert kw.queue_of(JobRef("tiny", "team", "u-1", labels=labels)) == queue


def test_one_pod_set_for_the_whole_gang_with_the_pods_requests():
    wl = workload(resources={"requests": {"cpu": "2", "memory": "4Gi", "ephemeralStorage": "1Gi"},
                             "limits": {"memory": "8Gi"}})
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == "rltj-tiny" and wl["metadata"]["namespace"] == "team"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    assert wl["metadata"]["labels"]["rlkube.io/job"] == "tiny"
    assert wl["spec"]["queueName"] == "gpu-team"
    [pod_set] = wl["spec"]["podSets"]
    assert pod_set["name"] == "workers" and pod_set["count"] == 2 and "minCount" not in pod_set
    [container] = pod_set["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "1Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "8Gi", "nvidia.com/gpu": "2"},
    }
    assert pod_set["template"]["spec"]["restartPolicy"] == "Never"
    assert "priority" not in wl["spec"] and "priorityClassRef" not in wl["spec"]


def test_node_selector_tolerations_and_priority_reach_the_template():
    s = gang_spec(nodeSelector={"pool": "a100"}, priorityClassName="high",
                  tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    wl = kw.render_workload(JOB, s, "gpu-team", priority=1000)
    pod_spec = wl["spec"]["podSets"][0]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "a100"}
    assert pod_spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod_spec["priorityClassName"] == "high"
    assert wl["spec"]["priorityClassRef"] == {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    assert wl["spec"]["priority"] == 1000
    # Kueue refuses a class reference without its value: without one, neither is set.
    assert "priorityClassRef" not in kw.render_workload(JOB, s, "gpu-team")["spec"]


def test_elastic_job_asks_for_max_workers_and_accepts_min_workers():
    s = parse_spec(spec("dpo", gpus_per_pod=1, roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
                        elastic={"minWorkers": 1, "maxWorkers": 3}))
    [pod_set] = kw.render_workload(JOB, s, "gpu-team")["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (3, 1)


def test_pending_workload_explains_why_it_waits():
    wl = with_status(workload(), cond("QuotaReserved", False, "Pending",
                                      "couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu"))
    state = kw.observe_workload(wl)
    assert not state.admitted and not state.quota_reserved and not state.evicted and not state.finished
    assert state.admitted_pods is None and state.cluster_queue is None
    assert state.waiting_message() == ("waiting for Kueue admission in queue gpu-team: couldn't assign flavors "
                                       "to pod set workers: insufficient quota for nvidia.com/gpu")


@pytest.mark.parametrize("assignment, pods", [
    ({"name": "workers", "count": 1, "flavors": {"nvidia.com/gpu": "default"}}, 1),
    ({"name": "workers", "flavors": {"nvidia.com/gpu": "default"}}, 2),   # count left out: the whole set
])
def test_admitted_workload_names_its_queue_and_pod_count(assignment, pods):
    wl = with_status(workload(), cond("QuotaReserved", True), cond("Admitted", True, "Admitted"),
                     admission={"clusterQueue": "team-cq", "podSetAssignments": [assignment]})
    state = kw.observe_workload(wl)
    assert state.admitted and state.quota_reserved and not state.evicted
    assert (state.cluster_queue, state.admitted_pods, state.reason) == ("team-cq", pods, "Admitted")


@pytest.mark.parametrize("conditions, count, cap, partial, message", [
    # (conditions Kueue set, admitted count of 3 asked) -> worker_cap, partial, admission message
    ((cond("QuotaReserved", True), cond("Admitted", True)), 2, 2, True, "admitted 2 of 3 pods by Kueue"),
    ((cond("QuotaReserved", True), cond("Admitted", True)), 3, 3, False, "admitted 3 of 3 pods by Kueue"),
    ((cond("QuotaReserved", True), cond("Admitted", False)), 2, None, True, None),   # checks pending
    ((cond("QuotaReserved", True), cond("Admitted", True), cond("Evicted", True, "Preempted")), 2, None, True, None),
])
def test_partial_admission_caps_the_workers_while_it_holds(conditions, count, cap, partial, message):
    s = parse_spec(spec("dpo", gpus_per_pod=1, roles={"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
                        elastic={"minWorkers": 1, "maxWorkers": 3}))
    wl = with_status(kw.render_workload(JOB, s, "gpu-team"), *conditions,
                     admission={"clusterQueue": "team-cq", "podSetAssignments": [{"name": "workers", "count": count}]})
    state = kw.observe_workload(wl)
    assert (state.asked_pods, state.admitted_pods, state.worker_cap, state.partial) == (3, count, cap, partial)
    if message is not None:
        assert state.admission_message() == message


def test_evicted_workload_says_why():
    wl = with_status(workload(), cond("QuotaReserved", True), cond("Admitted", True),
                     cond("Evicted", True, "Preempted", "Preempted to accommodate a higher priority Workload"))
    state = kw.observe_workload(wl)
    assert state.evicted and (state.reason, state.message) == (
        "Preempted", "Preempted to accommodate a higher priority Workload")


@pytest.mark.parametrize("reason, requeued", [("Preempted", "True"), ("NodeFailures", "True"),
                                              ("ClusterQueueStopped", "False")])
def test_release_after_eviction_clears_admission_and_requeues_like_kueues_integrations(reason, requeued):
    wl = with_status(workload(), cond("QuotaReserved", True), cond("Admitted", True, "Admitted"),
                     cond("Evicted", True, reason, "evicted"),
                     admission={"clusterQueue": "team-cq", "podSetAssignments": [{"name": "workers", "count": 2}]})
    patch = kw.release_patch(wl, T0)
    assert patch["metadata"] == {"resourceVersion": "42"}
    assert patch["status"]["admission"] is None
    by_type = {c["type"]: c for c in patch["status"]["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False"
    assert by_type["Requeued"]["status"] == requeued and by_type["Requeued"]["reason"] == reason
    assert by_type["Evicted"] == cond("Evicted", True, reason, "evicted")   # Kueue's own, untouched
    assert by_type["QuotaReserved"]["lastTransitionTime"] == "2026-12-03T12:00:00Z"
    state = kw.observe_workload({**wl, "status": {k: v for k, v in patch["status"].items() if v is not None}})
    # Evicted stays True until Kueue reserves quota again; released, the job just waits.
    assert not state.admitted and not state.quota_reserved and not state.evicted
    assert (state.reason, state.message) == ("Pending", "evicted")


def test_finish_sets_finished_and_keeps_the_rest():
    wl = with_status(workload(), cond("QuotaReserved", True), cond("Admitted", True, "Admitted"))
    patch = kw.finish_patch(wl, succeeded=False, message="pod tiny-actor-0 exited with code 3", now=T0)
    conditions = patch["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["QuotaReserved", "Admitted", "Finished"]
    assert conditions[-1] | {"lastTransitionTime": "x"} == {
        "type": "Finished", "status": "True", "reason": "Failed", "message": "pod tiny-actor-0 exited with code 3",
        "observedGeneration": 1, "lastTransitionTime": "x"}
    assert kw.observe_workload({**wl, "status": patch["status"]}).finished


def test_condition_keeps_its_transition_time_while_its_status_holds():
    old = [cond("QuotaReserved", False, "Pending", "no quota", at="2026-12-03T10:00:00Z")]
    same = kw.set_condition(old, "QuotaReserved", False, "Pending", "still none", T0, 2)
    assert same[0]["lastTransitionTime"] == "2026-12-03T10:00:00Z" and same[0]["message"] == "still none"
    flipped = kw.set_condition(old, "QuotaReserved", True, "QuotaReserved", "", T0, 2)
    assert flipped[0]["lastTransitionTime"] == "2026-12-03T12:00:00Z"
    assert len(kw.set_condition(old, "x" * 3, True, "r", "m" * 40000, T0, 2)[1]["message"]) == kw.MAX_MESSAGE
