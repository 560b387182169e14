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

    def admit(self, count: int = 4) -> None:
        self.workload.setdefault("status", {})["admission"] = {"clusterQueue": "team-a-cq",
                                                "podSetAssignments": [{"name": "workers", "count": count}]}
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


def elastic_queued_world() -> KueueWorld:
    """An elastic DPO job of pods of 1 GPU, 1..4 workers, on two nodes of 4 free GPUs: the
    nodes alone would take all 4 pods (on one node, as its hostPath checkpoints require)."""
    return KueueWorld(job(labels=QUEUE, algorithm="dpo", roles={"actor": {"gpus": 2}},
                          elastic={"minWorkers": 1, "maxWorkers": 4}), [node("a", 4), node("b", 4)])


def pod_count(d: lifecycle.Decision) -> int:
    return len([o for o in d.create if o["kind"] == "Pod"])


def test_partly_admitted_elastic_job_runs_at_the_admitted_count_and_never_grows_past_it():
    w = elastic_queued_world()
    d = w.step(at(0))
    assert (d.workload["spec"]["podSets"][0]["count"], d.workload["spec"]["podSets"][0]["minCount"]) == (4, 1)
    w.admit(count=2)                         # partial admission: the quota holds 2 of the 4 pods
    d = w.step(at(1))
    assert pod_count(d) == 2 and len(w.status["placement"]["pods"]) == 2
    admitted = next(e for e in w.events if e.reason == "AdmittedByKueue")
    assert admitted.message.startswith("admitted 2 of 4 pods by Kueue (Workload rltj-tiny, ClusterQueue team-a-cq")
    placed = next(e for e in w.events if e.reason == "Placed")
    assert "elastic: 2 pods of minWorkers 1..maxWorkers 4" in placed.message
    assert "admitted 2 of 4 pods by Kueue" in placed.message
    assert progressing(w)["message"] == "creating 2 pods (admitted 2 of 4 pods by Kueue)"
    w.bind_all()
    w.step(at(2))
    assert w.status["phase"] == "Running" and progressing(w)["message"] == "2 pods running (admitted 2 of 4 pods by Kueue)"
    for t in range(3, 60, 5):                # 6 GPUs stay free, but the admission does not grow
        d = w.step(at(t))
        assert d.action == "wait" and not d.delete and not d.create and len(w.pods) == 2
    assert "ElasticGrow" not in w.reasons()


def running_with_two_of_four_admitted():
    """The elastic job (1-4 pods) admitted 2 of 4 by Kueue, its gang bound and running at t=2."""
    w = elastic_queued_world()
    w.step(at(0))
    w.admit(count=2)
    w.step(at(1))
    w.bind_all()
    w.step(at(2))
    return w


def test_the_cap_follows_kueues_admission_up_and_down():
    w = running_with_two_of_four_admitted()
    w.admit(count=3)                         # the admission grows: grow to it, not to the 4 that fit
    d = w.step(at(5))
    assert d.action == "replan" and len(d.delete) == 2 and w.status["restarts"] == 0
    grow = next(e for e in w.events if e.reason == "ElasticGrow")
    assert "3 pods fit now, running with 2 (maxWorkers 4; admitted 3 of 4 pods by Kueue)" in grow.message
    d = w.step(at(6))
    assert pod_count(d) == 3
    w.bind_all()
    w.step(at(7))
    assert w.status["phase"] == "Running" and len(w.pods) == 3

    w.admit(count=1)                         # the admission shrinks under the running gang
    d = w.step(at(10))
    assert d.action == "replan" and len(d.delete) == 3 and w.status["restarts"] == 0
    assert w.reasons()[-1] == "KueueAdmissionChanged"
    assert "the gang has 3 pods, Kueue now admits 1" in w.events[-1].message
    d = w.step(at(11))
    assert pod_count(d) == 1 and w.status["attempt"] == 2


def test_an_admission_below_min_workers_plans_nothing_and_says_why():
    w = elastic_queued_world()
    w.job["spec"]["elastic"]["minWorkers"] = 2
    w.step(at(0))
    w.admit(count=1)                         # Kueue would not do this (minCount 2); the planner holds anyway
    d = w.step(at(1))
    assert not d.create and w.status["phase"] == "Pending"
    assert "at most 1 pods are admitted, fewer than the smallest gang of 2 pods" in progressing(w)["message"]


def test_readmission_right_after_the_release_says_what_kueue_admitted_now():
    w = running_with_two_of_four_admitted()
    w.evict()
    w.step(at(5))                            # pods deleted
    assert w.step(at(6)).action == "release"
    w.admit(count=1)                         # Kueue re-admits before the job was seen queued
    d = w.step(at(7))
    assert pod_count(d) == 1
    admitted = [e.message for e in w.events if e.reason == "AdmittedByKueue"]
    assert len(admitted) == 2 and admitted[1].startswith("admitted 1 of 4 pods by Kueue")
