"""Node loss (lifecycle/node_loss.py): a node NotReady/Unknown past the grace, or tainted
out-of-service, re-plans the gang away from it, force-deletes the pods stranded there, and an
elastic gang that no longer fits shrinks."""

from __future__ import annotations

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import format_time, pod_views

FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15,
                          node_lost_grace_seconds=60, host_path_shared=True)  # gangs span nodes
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}


def running(w: World) -> World:
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(3))
    assert w.status["phase"] == "Running", w.status
    return w


def ppo_world(settings: lifecycle.Settings = FAST) -> World:
    """A PPO job (4 pods of 1 GPU) on nodes a, b (2 GPUs each) and a spare c (4 GPUs)."""
    w = World(job(), [node("a", 2), node("b", 2), node("c", 4)], settings)
    w.other_pods = [{"metadata": {"name": "hold-c", "namespace": "x", "uid": "x"},
                     "spec": {"nodeName": "c", "containers": [
                         {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
                     "status": {"phase": "Running"}}]
    return running(w)


def stop_reporting(w: World, name: str, since: float, status: str = "Unknown") -> list[str]:
    """The kubelet of `name` went silent at `since`: the node controller marks the node and its
    pods not ready. Returns the job's pods on it."""
    n = next(n for n in w.nodes if n["metadata"]["name"] == name)
    n["status"]["conditions"] = [{"type": "Ready", "status": status, "lastTransitionTime": format_time(at(since))}]
    on = [p for p, pod in w.pods.items() if pod["spec"].get("nodeName") == name]
    for p in on:
        w.set_pod(p, "Running", ready=False)
    return on


def test_a_node_unknown_past_the_grace_replans_the_gang_and_force_deletes_its_pods():
    w = ppo_world()
    w.other_pods = []  # c is free: the new attempt goes there
    on_a = stop_reporting(w, "a", since=10)
    d = w.step(at(30))  # within the grace: judged as usual, looked at again when the grace ends
    assert d.action == "wait" and w.status["attempt"] == 0 and not d.force_delete
    assert d.requeue_after == pytest.approx(40)

    d = w.step(at(71))
    assert d.action == "replan" and w.status["phase"] == "Restarting"
    assert sorted(d.force_delete) == sorted(on_a) and not set(d.delete) & set(on_a) and len(d.delete) == 2
    assert w.status["attempt"] == 1 and w.status["restarts"] == 0
    (lost,) = [e for e in w.events if e.reason == "NodeLost"]
    assert lost.type == "Warning" and "node a has been Unknown for 61s (grace 60s)" in lost.message

    d = w.step(at(72))  # every pod of attempt 0 is gone: planned anew, away from a
    assert {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in d.create if p["kind"] == "Pod"} <= {"b", "c"}
    assert w.status["phase"] == "Scheduling" and w.status["attempt"] == 1


def test_an_out_of_service_taint_is_a_lost_node_at_once():
    w = ppo_world()
    n = next(n for n in w.nodes if n["metadata"]["name"] == "b")
    n["spec"]["taints"] = [OUT_OF_SERVICE]
    on_b = [p for p, pod in w.pods.items() if pod["spec"]["nodeName"] == "b"]
    for p in on_b:  # the taint eviction controller deletes the pods that do not tolerate it
        w.pods[p]["metadata"]["deletionTimestamp"] = format_time(at(35))
    d = w.step(at(5))
    assert d.action == "replan" and sorted(d.force_delete) == sorted(on_b)
    assert "node b is tainted node.kubernetes.io/out-of-service" in w.events[-1].message


def test_a_healthy_running_gang_does_not_list_nodes():
    w = ppo_world()
    view = w.view()
    d = lifecycle.decide(view, pod_views(list(w.pods.values())), at(10), None, None, FAST)
    assert not d.need_cluster and d.action == "wait"


def test_a_node_loss_counts_against_backoff_limit_only_when_configured():
    settings = lifecycle.Settings(node_lost_grace_seconds=60, node_lost_counts=True, host_path_shared=True)
    w = ppo_world(settings)
    stop_reporting(w, "a", since=0, status="False")
    w.step(at(61))
    assert w.status["restarts"] == 1 and "NotReady for 61s" in w.events[-1].message


def test_an_elastic_gang_that_no_longer_fits_shrinks():
    w = World(job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 4}},
                  elastic={"minWorkers": 1, "maxWorkers": 2}), [node("a", 2), node("b", 2)], FAST)
    running(w)
    assert len(w.status["placement"]["pods"]) == 2
    stop_reporting(w, "a", since=5)
    w.step(at(70))
    assert [e.reason for e in w.events[-2:]] == ["ElasticShrink", "NodeLost"]
    assert "1 pods fit without node(s) a, running with 2" in w.events[-2].message
    d = w.step(at(71))
    pods = [o for o in d.create if o["kind"] == "Pod"]
    assert len(pods) == 1 and w.status["gpus"] == 2


def test_pods_of_an_earlier_attempt_stranded_on_a_lost_node_are_force_deleted():
    w = ppo_world()
    on_a = stop_reporting(w, "a", since=0)
    w.set_pod(sorted(set(w.pods) - set(on_a))[0], "Failed", exit_code=1)  # a crash restarts the gang
    d = w.step(at(20))
    assert d.action == "restart" and w.status["attempt"] == 1
    # The World deletes at once; on a real cluster the two pods on a stay terminating, since no
    # kubelet there will ever confirm them gone.
    assert not w.pods
    w.pods.update(stranded(on_a))
    d = w.step(at(40))  # not overdue yet: wait for them
    assert d.action == "wait" and not d.force_delete
    d = w.step(at(62))
    assert d.action == "force-delete" and sorted(d.force_delete) == sorted(on_a)
    assert w.events[-1].reason == "ForceDeleted"


def stranded(names: list[str]) -> dict[str, dict]:
    return {n: {"metadata": {"name": n, "namespace": "team", "labels": {"rlkube.io/attempt": "0",
                                                                        "rlkube.io/job": "tiny"},
                             "deletionTimestamp": format_time(at(50)),
                             "ownerReferences": [{"uid": "0000-job-uid"}]},
                "spec": {"nodeName": "a"}, "status": {"phase": "Running"}} for n in names}
