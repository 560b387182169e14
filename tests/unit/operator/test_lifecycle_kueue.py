"""Rule 4b: a job labelled with a Kueue LocalQueue waits for its Workload's admission, is
suspended when Kueue evicts it, and gives the quota back when it ends (docs/kueue.md)."""

from __future__ import annotations

import copy

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.lifecycle import queue

QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}


class KueueWorld(World):
    """World plus the job's Workload, which decisions create and patch and the test's Kueue
    (`admit`, `evict`, `refuse`) writes like Kueue does."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.workload: dict | None = None
        self.decisions: list[lifecycle.Decision] = []

    def step(self, now, progress=None, crash_after=None):
        real = lifecycle.decide

        def decide(*args, **kwargs):
            return real(*args, **kwargs, workload=copy.deepcopy(self.workload))

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lifecycle, "decide", decide)
            decision = super().step(now, progress, crash_after)
        if decision.workload is not None and self.workload is None:
            self.workload = copy.deepcopy(decision.workload)
            self.workload["metadata"].update(resourceVersion="1", generation=1)
        if decision.workload_status is not None:
            assert decision.workload_status["metadata"]["resourceVersion"] == self.workload["metadata"]["resourceVersion"]
            status = {**self.workload.get("status", {}), **decision.workload_status["status"]}
            self.workload["status"] = {k: v for k, v in status.items() if v is not None}
            self._bump()
        self.decisions.append(decision)
        return decision

    def _bump(self) -> None:
        meta = self.workload["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def _kueue_sets(self, **conditions: tuple[bool, str, str]) -> None:
        current = {c["type"]: c for c in self.workload.setdefault("status", {}).get("conditions", [])}
        for kind, (status, reason, message) in conditions.items():
            current[kind] = {"type": kind, "status": "True" if status else "False", "reason": reason,
                             "message": message, "lastTransitionTime": "2026-12-02T12:00:00Z"}
        self.workload["status"]["conditions"] = list(current.values())
        self._bump()

    def refuse(self, message: str) -> None:
        self._kueue_sets(QuotaReserved=(False, "Pending", message))

    def admit(self) -> None:
        self.workload.setdefault("status", {})["admission"] = {"clusterQueue": "team-a-cq",
                                                "podSetAssignments": [{"name": "workers", "count": 4}]}
        self._kueue_sets(QuotaReserved=(True, "QuotaReserved", "Quota reserved in ClusterQueue team-a-cq"),
                         Admitted=(True, "Admitted", "The workload is admitted"),
                         Evicted=(False, "QuotaReserved", ""))

    def evict(self) -> None:
        self._kueue_sets(Evicted=(True, "Preempted", "Preempted to accommodate a higher priority Workload"))


def queued_world(**kw) -> KueueWorld:
    return KueueWorld(job(labels=QUEUE, **kw), [node("a", 4), node("b", 4)])


def progressing(w: World) -> dict:
    return next(c for c in w.status["conditions"] if c["type"] == "Progressing")


def running(w: KueueWorld, t: float) -> None:
    w.admit()
    w.step(at(t))            # plan + create (Kueue's admission: no gate of ours to remove)
    w.bind_all()
    w.step(at(t + 1))
    assert w.status["phase"] == "Running", w.status


def test_queued_job_waits_visibly_for_kueue_then_starts_as_one_gang():
    w = queued_world()
    d = w.step(at(0))
    assert d.action == "queue" and not d.create and not w.pods
    assert d.workload["spec"]["queueName"] == "team-a" and d.workload["spec"]["podSets"][0]["count"] == 4
    assert w.status["phase"] == "Pending"
    assert (progressing(w)["reason"], progressing(w)["message"]) == (
        "QueuedInKueue", "waiting for Kueue admission in queue team-a")
    assert w.reasons() == ["Queued"]

    w.refuse("couldn't assign flavors to pod set workers: insufficient quota for nvidia.com/gpu")
    d = w.step(at(5))
    assert d.workload is None and not d.create and d.requeue_after == queue.POLL_SECONDS
    assert progressing(w)["message"] == ("waiting for Kueue admission in queue team-a: couldn't assign flavors to "
                                         "pod set workers: insufficient quota for nvidia.com/gpu")
    w.step(at(10))
    assert w.reasons() == ["Queued"]         # one Event for the wait, not one per poll

    w.admit()
    d = w.step(at(15))
    assert d.action == "create" and len([o for o in d.create if o["kind"] == "Pod"]) == 4
    assert w.reasons()[1:3] == ["AdmittedByKueue", "Placed"]


def test_evicted_job_stops_releases_its_quota_and_resumes_on_readmission():
    w = queued_world()
    w.step(at(0))
    running(w, 1)
    w.evict()
    d = w.step(at(10))
    assert len(d.delete) == 4 and d.workload_status is None       # pods first, quota after
    assert w.status["phase"] == "Pending" and w.status["attempt"] == 1 and "placement" not in w.status
    assert progressing(w)["reason"] == "EvictedByKueue" and "Preempted" in progressing(w)["message"]
    assert w.reasons()[-1] == "Evicted"

    d = w.step(at(12))                       # the pods are gone: hand the quota back
    assert d.action == "release" and d.workload_status["status"]["admission"] is None
    assert "admission" not in w.workload["status"]
    d = w.step(at(15))
    assert not d.create and progressing(w)["reason"] == "QueuedInKueue"
    assert w.reasons().count("Evicted") == 1

    w.admit()
    d = w.step(at(20))
    assert d.action == "create"
    assert {p["metadata"]["labels"]["rlkube.io/attempt"] for p in w.pods.values()} == {"1"}
    assert w.status["restarts"] == 0         # an eviction is not the job's failure


def test_finished_job_gives_its_quota_back_once():
    w = queued_world()
    w.step(at(0))
    running(w, 1)
    for name in list(w.pods):
        w.set_pod(name, "Succeeded", exit_code=0)
    w.step(at(10))
    assert w.status["phase"] == "Succeeded"
    d = w.step(at(11))
    assert d.workload_status is not None
    finished = next(c for c in w.workload["status"]["conditions"] if c["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    assert w.step(at(12)).workload_status is None


def test_job_without_a_queue_label_never_makes_a_workload():
    w = KueueWorld(job(), [node("a", 4), node("b", 4)])
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(3))
    assert w.status["phase"] == "Running" and w.workload is None
    assert all(d.workload is None and d.workload_status is None for d in w.decisions)
