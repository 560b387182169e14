"""First come, first served among waiting gangs (planning/fifo.py): oldest first within a
priority class, and the oldest waiting job's GPUs held back from younger ones."""

from __future__ import annotations

import pytest
from operator_builders import at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import JobView
from rlkube.operator.planning.cluster import cluster_view
from rlkube.operator.planning.inventory import waiting_jobs
from rlkube.operator.render.status import condition

FAST = lifecycle.Settings(unschedulable_retry_seconds=15)


def queued(name: str, created: str, gpus: int, status: dict | None = None, labels: dict | None = None,
           **spec) -> dict:
    """A DPO job of `gpus` GPUs in pods of up to 4, created at `created` (HH:MM:SS on T0's day)."""
    obj = job(name, status=status, labels=labels, algorithm="dpo", gpus_per_pod=min(gpus, 4),
              roles={"actor": {"gpus": gpus}}, **spec)
    obj["metadata"].update(uid=f"uid-{name}", creationTimestamp=f"2026-12-02T{created}Z")
    return obj


def blocker(node_name: str, gpus: int) -> dict:
    return {"metadata": {"name": f"other-{node_name}", "namespace": "x", "uid": "x"},
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


def decide(obj: dict, nodes: list[dict], others: list[dict], jobs: list[dict]) -> lifecycle.Decision:
    view = JobView.from_object(obj)
    cluster = cluster_view(nodes, others, view.spec, own_uid=view.ref.uid, jobs=jobs)
    return lifecycle.decide(view, [], at(0), cluster, None, FAST)


NODES = [node("a", 4), node("b", 4)]


def test_a_younger_small_job_does_not_take_the_gpus_an_older_large_one_waits_for():
    big, small = queued("big", "10:00:00", 8), queued("small", "10:00:05", 2)
    others = [blocker("b", 4)]  # 4 GPUs free: not enough for big, enough for small
    d = decide(small, NODES, others, [big, small])
    assert d.status["phase"] == "Pending"
    message = condition(d.status, "Placed")["message"]
    assert "GPUs held for older waiting job(s) team/big (first come, first served)" in message
    # the older one does not wait behind the younger
    assert decide(big, NODES, others, [big, small]).status["phase"] == "Pending"  # it does not fit yet
    assert "held for" not in condition(decide(big, NODES, others, [big, small]).status, "Placed")["message"]


def test_jobs_that_all_fit_are_all_placed_the_older_plan_reserved_first():
    first, second = queued("first", "10:00:00", 4), queued("second", "10:00:01", 4)
    d = decide(second, NODES, [], [first, second])
    assert d.status["phase"] == "Scheduling"
    assert {p["node"] for p in d.status["placement"]["pods"]} == {"b"}  # a is the older job's plan


@pytest.mark.parametrize("older", [
    queued("other-class", "09:00:00", 8, priorityClassName="batch-low"),   # another priority class
    queued("huge", "09:00:00", 16),                                       # never fits this cluster
    queued("placed", "09:00:00", 8, status={"phase": "Running"}),          # not waiting
    queued("suspended", "09:00:00", 8, runPolicy={"suspend": True}),
    queued("kueue", "09:00:00", 8, labels={"kueue.x-k8s.io/queue-name": "q"}),  # Kueue orders it
    queued("younger", "11:00:00", 8),
])
def test_what_holds_nothing_back(older):
    small = queued("small", "10:00:00", 2)
    d = decide(small, NODES, [blocker("b", 4)], [older, small])
    assert d.status["phase"] == "Scheduling", condition(d.status, "Placed")


def test_waiting_jobs_are_ordered_by_creation_then_name():
    jobs = [queued("c", "10:00:01", 2), queued("b", "10:00:00", 2), queued("a", "10:00:01", 2),
            queued("done", "09:00:00", 2, status={"phase": "Succeeded"}),
            queued("pending", "09:30:00", 2, status={"phase": "Pending"})]
    assert [w.name for w in waiting_jobs(jobs)] == ["pending", "b", "a", "c"]
