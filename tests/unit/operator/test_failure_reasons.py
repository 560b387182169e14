"""Failure reasons a user reads in `kubectl describe`: the trainer's termination message in the
Failed condition and its Event, a child the API server refuses, a gang whose pods cannot be
created, and Pending reasons that name the real cause (nodeSelector, taint, capacity)."""

from __future__ import annotations

import json

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import PodView, pod_views
from rlkube.operator.lifecycle.rejection import rejected
from rlkube.operator.render.status import condition

FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15)
CONFIG_ERROR = json.dumps({"error": {"exit": "config", "field": "data.source",
                                     "message": "data.source: '/data/train.jsonl' does not exist"}})


def running_world(**kw) -> World:
    w = World(job(**kw), [node("a", 4), node("b", 4)], FAST)
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(3))
    assert w.status["phase"] == "Running"
    return w


def test_the_termination_message_error_is_read_as_one_line_naming_the_field():
    pod = {"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 3, "message": CONFIG_ERROR}}}]}}
    view = PodView.from_object(pod)
    assert view.failure == "config error: data.source: '/data/train.jsonl' does not exist"
    assert view.message == ""  # JSON is data, not a message for people
    both = json.dumps({"progress": {"step": 3}, "error": {"exit": "crash", "message": "RuntimeError: boom"}})
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = both
    view = PodView.from_object(pod)
    assert view.failure == "crash: RuntimeError: boom" and view.final_progress == {"step": 3}


def test_a_config_error_fails_at_once_with_the_field_in_the_condition_and_the_event():
    w = running_world()
    w.set_pod(sorted(w.pods)[0], "Failed", exit_code=3, message=CONFIG_ERROR)
    d = w.step(at(5))
    assert d.action == "fail" and w.status["phase"] == "Failed" and w.status["restarts"] == 0
    failed = condition(w.status, "Failed")
    assert failed["reason"] == "ExitCode" and "data.source: '/data/train.jsonl' does not exist" in failed["message"]
    assert w.events[-1].reason == "ExitCode" and w.events[-1].message == failed["message"]


def test_a_crash_says_why_when_it_restarts():
    w = running_world()
    crash = json.dumps({"error": {"exit": "crash", "message": "RuntimeError: CUDA error: an illegal memory access"}})
    w.set_pod(sorted(w.pods)[1], "Failed", exit_code=1, message=crash)
    w.step(at(5))
    assert w.status["restarts"] == 1 and "exited with code 1: crash: RuntimeError: CUDA error" in w.events[-1].message


def test_a_child_the_api_server_refuses_fails_the_job_naming_the_field():
    w = World(job(), [node("a", 4)], FAST)
    w.step(at(0))
    message = ('Pod "tiny-actor-0" is invalid: spec.containers[0].volumeMounts[1].mountPath: Invalid value: '
               '"/data": must be unique')
    d = rejected(w.view(), pod_views(list(w.pods.values())), at(1), "Pod", "tiny-actor-0", message)
    assert d.action == "fail" and d.status["phase"] == "Failed"
    failed = condition(d.status, "Failed")
    assert failed["reason"] == "CreateRejected" and "volumeMounts[1].mountPath" in failed["message"]
    assert d.events[-1].reason == "CreateRejected" and sorted(d.delete) == sorted(w.pods)
    w.job["status"] = d.status  # a finished job is not failed twice
    assert rejected(w.view(), [], at(2), "Pod", "tiny-actor-0", message) is None


def test_pods_that_cannot_be_created_time_out_like_pods_that_never_bind():
    w = World(job(placement={"gpusPerPod": 1, "gangTimeoutSeconds": 30}), [node("a", 4)], FAST)
    w.step(at(0), crash_after=3)  # Service, ConfigMap and one pod: the other creates keep failing
    for t in (5, 10):
        d = w.step(at(t), crash_after=3)
        assert d.action == "create"
    d = w.step(at(31))
    assert d.action == "replan" and w.events[-1].reason == "GangTimeout"
    assert "not created within gangTimeoutSeconds 30" in w.events[-1].message


@pytest.mark.parametrize(("nodes", "overrides", "words"), [
    ([node("a", 4, labels={"pool": "h100"}), node("b", 4, labels={"pool": "h100"})],
     {"nodeSelector": {"pool": "a100"}},
     "no node can take the pods: 2 do not match nodeSelector pool=a100 (a, b)"),
    ([node("a", 4, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]), node("b", 2)], {},
     "of 2 nodes: 1 have taint dedicated=infer:NoSchedule the pods do not tolerate (a)"),
    ([node("a", 2, ready=False), node("b", 2)], {}, "of 2 nodes: 1 are not Ready (a)"),
])
def test_pending_names_the_real_cause(nodes, overrides, words):
    w = World(job(algorithm="dpo", gpus_per_pod=4, roles={"actor": {"gpus": 4}}, **overrides), nodes, FAST)
    w.step(at(0))
    assert w.status["phase"] == "Pending"
    placed = condition(w.status, "Placed")
    assert placed["reason"] == "Unschedulable" and words in placed["message"], placed["message"]
    assert words in w.events[-1].message
