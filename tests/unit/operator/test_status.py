"""Status summarizing pieces: conditions, the placement as status, progress, the status patch and
per-role readiness."""

from __future__ import annotations

import pytest
from operator_builders import World, at, job, node, with_status

from rlkube.operator.api.observed import pod_views
from rlkube.operator.planning.placement import Placement, PodPlan
from rlkube.operator.render.status import (
    placement_from_status,
    placement_to_status,
    progress_status,
    role_readiness,
    set_condition,
    status_patch,
)


def test_condition_keeps_transition_time_while_status_holds():
    c = set_condition([], "Ready", False, "PodsNotReady", "0/2", at(0), 1)
    c = set_condition(c, "Ready", False, "PodsNotReady", "1/2", at(5), 2)
    assert c[0]["lastTransitionTime"] == "2026-12-02T12:00:00Z" and c[0]["message"] == "1/2"
    assert c[0]["observedGeneration"] == 2
    c = set_condition(c, "Ready", True, "AllPodsReady", "2/2", at(9), 2)
    assert c[0]["lastTransitionTime"] == "2026-12-02T12:00:09Z" and c[0]["status"] == "True"


def test_placement_round_trips_through_status():
    p = Placement(pods=(PodPlan(0, "a", (0, 1), ("actor",)), PodPlan(1, "b", (2, 3), ("critic", "reward"))),
                  device_map={"actor": [0, 1], "critic": [2], "reward": [3]}, domains={"actor": "h=a"},
                  fallback=True, messages=("x",))
    st = placement_to_status(p, ["j-actor-0", "j-critic-1"])
    assert st["pods"][1] == {"name": "j-critic-1", "index": 1, "node": "b", "ranks": [2, 3], "roles": ["critic", "reward"]}
    back = placement_from_status(st)
    assert back.pods == p.pods and back.device_map == p.device_map and back.fallback


@pytest.mark.parametrize("report, expected", [
    ({"step": 5, "totalSteps": 30, "tokensPerSecond": 1.5e3, "mfu": 0.4, "loss": -0.2, "rewardMean": -1.0},
     {"step": 5, "totalSteps": 30, "tokensPerSecond": 1500.0, "mfu": 0.4, "loss": -0.2, "rewardMean": -1.0,
      "percent": 16.7}),  # derived from step/totalSteps (status.pace)
    ({"step": None, "mfu": float("nan"), "loss": float("inf"), "gpuUtilization": -1, "phase": "train"}, {}),
    ({"step": True, "tokensPerSecond": "fast", "extra": 1}, {}),
    ({"tokensPerSecond": 26904.229259433603}, {"tokensPerSecond": 26904.2}),  # as `kubectl get` shows it
])
def test_progress_keeps_only_valid_numbers(report, expected):
    out = progress_status(report, at(0))
    assert out.pop("updatedAt") == "2026-12-02T12:00:00Z"
    assert out == expected


def test_status_patch_nulls_what_was_dropped_and_writes_nothing_when_equal():
    old = {"phase": "Running", "placement": {"pods": [1], "fallback": False}, "nextAttemptTime": "x", "kopf": {"a": 1}}
    new = {"phase": "Restarting", "placement": {"pods": [1]}}
    assert status_patch(old, new) == {"phase": "Restarting", "placement": {"fallback": None}, "nextAttemptTime": None}
    assert status_patch(new, dict(new)) is None


def test_role_readiness_counts_ready_pods_of_the_current_attempt():
    p = Placement(pods=(PodPlan(0, "a", (0,), ("actor",)), PodPlan(1, "a", (1,), ("critic",))),
                  device_map={"actor": [0], "critic": [1], "reference": [0]}, domains={}, fallback=False, messages=())
    w = World(job(), [node("a", 4), node("b", 4)])
    w.step(at(0))
    pods = list(w.pods.values())
    views = pod_views([with_status(pods[0], "Running", node_name="a", ready=True),
                       with_status(pods[1], "Running", node_name="a", ready=False)])
    r = role_readiness(p.device_map, p, views, attempt=0)
    assert r["actor"] == {"ranks": [0], "pods": 1, "readyPods": 1, "ready": True}
    assert r["critic"]["ready"] is False and r["reference"]["ready"] is True
    assert role_readiness(p.device_map, p, views, attempt=1)["actor"]["readyPods"] == 0
