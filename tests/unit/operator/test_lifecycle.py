"""The lifecycle decisions (`lifecycle.decide`) across its policies: admission, repair and the
outcome of an admitted gang, table-driven on small jobs, pods and nodes, and properties over
random histories. A policy of a file of its own has its own tests too (test_restart.py,
test_deadline.py, test_ttl.py, test_suspend.py, test_elastic.py, test_node_loss.py)."""

from __future__ import annotations

import json

import pytest
from operator_builders import FAST, at, job, node, running_world, with_status, world

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import JobView, pod_views
from rlkube.operator.planning.cluster import cluster_view
from rlkube.operator.render.status import placement_from_status

# -- lifecycle decisions ----------------------------------------------------------------------


def test_new_job_asks_for_inventory_then_creates_gated_gang():
    w = world()
    d = lifecycle.decide(w.view(), [], at(0))
    assert d.need_cluster and d.status is None
    d = w.step(at(0))
    kinds = [o["kind"] for o in d.create]
    assert kinds == ["Service", "ConfigMap", "Pod", "Pod", "Pod", "Pod"]
    assert all(o["spec"]["schedulingGates"] == [{"name": "rlkube.io/gang"}] for o in d.create if o["kind"] == "Pod")
    assert w.status["phase"] == "Scheduling" and w.status["attempt"] == 0
    assert w.status["startTime"] == "2026-12-02T12:00:00Z"
    assert [c["type"] for c in w.status["conditions"] if c["status"] == "True"] == ["Placed", "Progressing"]
    assert len(w.status["placement"]["pods"]) == 4
    # planned on a fresh inventory: admitted in the same step, gates off once every create is done
    assert w.reasons() == ["Placed", "Admitted"] and w.status["admissionTime"] == "2026-12-02T12:00:00Z"
    assert sorted(u.name for u in d.ungate) == sorted(o["metadata"]["name"] for o in d.create if o["kind"] == "Pod")
    assert all(not p["spec"]["schedulingGates"] for p in w.pods.values())
    assert d.requeue_after == 600  # the gang timeout


def test_gated_pods_without_a_recorded_admission_are_checked_then_ungated():
    w = world()
    w.step(at(0), crash_after=6)  # the creates went through, the gate removals did not
    del w.job["status"]["admissionTime"]  # and no admission on record (an older operator's state)
    d = w.step(at(1))
    assert d.action == "ungate" and len(d.ungate) == 4
    assert all(not p["spec"]["schedulingGates"] for p in w.pods.values())
    assert w.status["admissionTime"] == "2026-12-02T12:00:01Z"


def test_admission_interrupted_between_two_gate_removals_is_finished():
    w = world()
    w.step(at(0), crash_after=7)  # 2 objects + 4 pods created, one gate removed, then a crash
    assert sum(1 for p in w.pods.values() if p["spec"]["schedulingGates"]) == 3
    d = w.step(at(2))
    assert d.action == "ungate" and len(d.ungate) == 3
    assert all(not p["spec"]["schedulingGates"] for p in w.pods.values())


def test_admission_interrupted_between_two_creates_is_finished():
    w = world()
    w.step(at(0), crash_after=4)  # Service, ConfigMap and 2 of the 4 pods
    assert len(w.pods) == 2
    d = w.step(at(1))
    assert d.action == "create" and len([o for o in d.create if o["kind"] == "Pod"]) == 2 and len(d.ungate) == 2
    w.step(at(2))  # the first two are still gated: their gates come off too
    assert len(w.pods) == 4 and all(not p["spec"]["schedulingGates"] for p in w.pods.values())


@pytest.mark.parametrize("created", [0, 2])
def test_admitted_gang_whose_gpus_were_taken_before_its_creates_is_replanned(created):
    """The admission was written, then the operator died with `created` of the 4 pods made: the
    missing pods held no GPUs in any inventory, so another gang was planned onto them meanwhile.
    Creating them would leave a gang that can never bind; it is planned again instead."""
    w = world()
    w.step(at(0), crash_after=2 + created)  # Service, ConfigMap, then `created` pods
    assert w.status["admissionTime"] and len(w.pods) == created
    planned = {p.node for p in placement_from_status(w.status["placement"]).pods}
    w.other_pods = [with_status({"metadata": {"name": f"x-{n}"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}, "Running", node_name=n)
        for n in sorted(planned)]
    d = w.step(at(1))
    assert d.action == "replan" and not d.create and w.status["attempt"] == 1 and w.status["restarts"] == 0
    assert "planned node" in w.events[-1].message and not w.pods
    w.other_pods = []  # the other gang is gone: the next plan fits and is admitted whole
    d = w.step(at(2))
    assert d.action == "create" and len(w.pods) == 4 and w.status["attempt"] == 1


def test_plan_that_no_longer_fits_is_replanned_not_counted():
    w = world()
    w.step(at(0), crash_after=6)
    del w.job["status"]["admissionTime"]  # gated, not admitted (see the test above)
    planned = {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
               ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in w.pods.values()}
    # Someone else's pod takes GPUs on the planned node while ours wait at the gate.
    w.other_pods = [with_status({"metadata": {"name": "x"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}, "Running", node_name=sorted(planned)[0])]
    d = w.step(at(1))
    assert d.action == "replan" and w.status["attempt"] == 1 and w.status["restarts"] == 0
    assert "planned node" in w.events[-1].message and not w.pods
    assert "nextAttemptTime" not in w.status


def test_unschedulable_stays_pending_with_one_event():
    w = world(nodes=[node("a", 1)])
    d = w.step(at(0))
    assert w.status["phase"] == "Pending" and d.requeue_after == 15 and not d.create
    placed = next(c for c in w.status["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "Unschedulable" and placed["message"]
    w.step(at(15))
    assert w.reasons() == ["Unschedulable"]  # not repeated while nothing changed
    w.nodes.append(node("b", 4))
    w.step(at(30))
    assert w.status["phase"] == "Scheduling"


def test_running_event_once_and_status_converges():
    w = running_world()
    assert w.reasons().count("Running") == 1
    writes = w.writes
    for t in (4, 5, 6):
        d = w.step(at(t))
        assert not d.create and not d.delete and not d.ungate and not d.events
    assert w.writes == writes  # nothing changes: no status write, no hot loop
    ready = next(c for c in w.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and w.status["roles"]["critic"]["ready"] is True


def test_progress_is_recorded_while_running():
    w = running_world()
    w.step(at(10), progress={"step": 7, "totalSteps": 30, "loss": 0.5})
    assert w.status["progress"]["step"] == 7
    w.step(at(11))
    assert w.status["progress"]["step"] == 7  # kept between polls


def test_a_run_that_ends_between_polls_leaves_its_final_report_in_the_status():
    """Rank 0 writes its last report as the termination message; it lands in status.progress
    with the Succeeded phase, once: later resyncs of the finished job write nothing."""
    w = running_world()
    w.step(at(10), progress={"step": 7, "totalSteps": 30, "loss": 0.5})
    final = json.dumps({"progress": {"phase": "succeeded", "step": 30, "totalSteps": 30, "loss": 0.1,
                                     "tokensPerSecond": 1234.5}})
    for i, name in enumerate(sorted(w.pods)):
        w.set_pod(name, "Succeeded", exit_code=0, message=final if i == 0 else "")
    w.step(at(12))
    assert w.status["phase"] == "Succeeded"
    assert w.status["progress"]["step"] == 30 and w.status["progress"]["tokensPerSecond"] == 1234.5
    writes = w.writes
    w.step(at(60))
    assert w.writes == writes  # the finished job's status is not rewritten on resync
    # A report is data: it does not become the pod's message in conditions.
    assert all("progress" not in (c.get("message") or "") for c in w.status["conditions"])


def test_stale_pods_are_deleted_and_waited_for():
    w = running_world()
    stale = dict(w.pods)
    w.set_pod(sorted(w.pods)[0], "Failed", exit_code=1)
    w.step(at(5))
    w.pods = {n: with_status(p, "Running", node_name="a") for n, p in stale.items()}  # deletion not done yet
    d = w.step(at(20))
    assert sorted(d.delete) == sorted(stale) and not d.create and w.status["phase"] == "Restarting"
    for p in stale.values():
        p["metadata"]["deletionTimestamp"] = "2026-12-02T12:00:20Z"
    w.pods = stale
    d = w.step(at(21))
    assert not d.delete and not d.create  # terminating: wait for them to go


@pytest.mark.parametrize("how, reason", [("evicted", "PodDisrupted"), ("vanished", "PodLost"), ("node", "NodeLost")])
def test_disruptions_replan_without_counting(how, reason):
    w = running_world()
    name = sorted(w.pods)[1]
    if how == "evicted":
        w.set_pod(name, "Failed", reason="Evicted", disrupted=True)
    elif how == "vanished":
        del w.pods[name]
    else:
        w.nodes = [n for n in w.nodes if n["metadata"]["name"] != w.pods[name]["spec"]["nodeName"]]
        # A running gang's reconcile does not list nodes (PodGC removes pods of a deleted node,
        # which is the "vanished" case); when the inventory is at hand, a gone node re-plans too.
        view = w.view()
        d = lifecycle.decide(view, pod_views(list(w.pods.values())), at(5),
                             cluster_view(w.nodes, [], view.spec), None, FAST)
        assert d.action == "replan" and d.events[-1].reason == reason
        return
    d = w.step(at(5))
    assert d.action == "replan" and w.events[-1].reason == reason
    assert w.status["attempt"] == 1 and w.status["restarts"] == 0 and "nextAttemptTime" not in w.status


def test_some_succeeded_others_running_is_still_running():
    w = running_world()
    w.set_pod(sorted(w.pods)[0], "Succeeded", exit_code=0)
    w.step(at(10))
    assert w.status["phase"] == "Running"


def test_gang_timeout_replans_but_not_for_volcano():
    w = world()
    w.step(at(0))  # planned, created and admitted; nothing binds the pods
    d = w.step(at(300))
    assert d.requeue_after == pytest.approx(300)
    d = w.step(at(601))
    assert d.action == "replan" and w.events[-1].reason == "GangTimeout" and w.status["restarts"] == 0

    v = world(schedulerName="volcano")
    d = v.step(at(0))
    assert all("schedulingGates" not in o["spec"] for o in d.create if o["kind"] == "Pod")
    assert not d.ungate and v.status["admissionTime"]  # admission is Volcano's: nothing to ungate
    d = v.step(at(5000))
    assert d.action == "wait" and v.status["phase"] == "Scheduling"


def test_invalid_spec_fails_with_the_field_path():
    w = world()
    w.job["spec"]["placement"] = {"gpusPerPod": 3}
    w.step(at(0))
    assert w.status["phase"] == "Failed"
    failed = next(c for c in w.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "spec.placement.gpusPerPod" in failed["message"]
    w.step(at(1))
    assert w.reasons() == ["InvalidSpec"]


# -- properties over random histories ----------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rlkube.operator.api import PHASES  # noqa: E402
from rlkube.operator.render import pod_names  # noqa: E402

ACTIONS = st.sampled_from(["bind", "fail1", "fail3", "evict", "vanish", "succeed", "suspend", "resume", "wait",
                           "crash0", "crash1", "crash2", "crash3"])


@settings(max_examples=50, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=20), st.integers(0, 3))
def test_random_histories_keep_the_invariants(actions, backoff_limit):
    w = world(runPolicy={"backoffLimit": backoff_limit})
    names = pod_names("tiny", w.view().spec)
    t, last_attempt, terminal = 0.0, 0, None
    for action in actions:
        pods = sorted(w.pods)
        if action == "bind":
            w.bind_all()
        elif action in ("fail1", "fail3", "evict", "succeed", "vanish") and pods:
            name = pods[int(t) % len(pods)]
            if not w.pods[name]["spec"].get("nodeName"):
                continue
            if action == "vanish":
                del w.pods[name]
            elif action == "evict":
                w.set_pod(name, "Failed", reason="Evicted", disrupted=True)
            elif action == "succeed":
                for n in pods:
                    if w.pods[n]["spec"].get("nodeName"):
                        w.set_pod(n, "Succeeded", exit_code=0)
            else:
                w.set_pod(name, "Failed", exit_code=int(action[-1]))
        elif action in ("suspend", "resume"):
            w.job["spec"]["runPolicy"]["suspend"] = action == "suspend"
        t += 7
        w.step(at(t), crash_after=int(action[-1]) if action.startswith("crash") else None)
        status = w.status
        # names are the deterministic ones, so no index can ever have two pods
        assert set(w.pods) <= set(names)
        assert status["phase"] in PHASES
        assert status["attempt"] >= last_attempt
        last_attempt = status["attempt"]
        assert status["restarts"] <= backoff_limit
        if terminal is not None:
            assert status["phase"] == terminal  # Succeeded and Failed are final
        elif status["phase"] in ("Succeeded", "Failed"):
            terminal = status["phase"]
        if status["phase"] not in ("Succeeded", "Failed"):
            # pods of other attempts are only ever on their way out
            assert all(p["metadata"]["labels"]["rlkube.io/attempt"] == str(status["attempt"])
                       for p in w.pods.values()) or status["phase"] in ("Restarting", "Suspended")
    # Quiescence: with nothing changing outside, the status stops changing (no hot loop), after
    # at most a few steps (backoff, re-creation, admission need their own steps).
    for _ in range(8):
        t += 400
        w.bind_all()  # a healthy scheduler from now on
        w.step(at(t))
    writes = w.writes
    w.step(at(t))
    assert w.writes == writes
    # With a healthy scheduler no gang may wait for its timeout: a crash mid-admission must not
    # leave a pod gated.
    assert "GangTimeout" not in w.reasons()
    if w.status["phase"] not in ("Succeeded", "Failed", "Suspended"):
        assert w.status["phase"] == "Running", w.status["phase"]


def test_unbound_pods_of_other_jobs_hold_their_planned_gpus():
    nodes = [node("a", 4), node("b", 4)]
    first = world(nodes=nodes)
    first.step(at(0))
    gated = list(first.pods.values())  # 4 pods of 1 GPU, gated, planned on one node
    planned_node = gated[0]["metadata"]["annotations"]["rlkube.io/planned-node"]
    other = job(name="other")
    other["metadata"]["uid"] = "other-uid"
    view = JobView.from_object(other)
    c = cluster_view(nodes, [], view.spec, planned=gated, own_uid="other-uid")
    free = {n.name: n.gpus_free for n in c.inventory}
    assert free[planned_node] == 0 and sum(free.values()) == 4
    d = lifecycle.decide(view, [], at(1), c)
    assert {o["metadata"]["annotations"]["rlkube.io/planned-node"] for o in d.create if o["kind"] == "Pod"} \
        == {n for n in free if n != planned_node}
    # a job's own unbound pods do not count against it (its admission check would never pass)
    own = cluster_view(nodes, [], view.spec, planned=gated, own_uid=first.view().ref.uid)
    assert all(n.gpus_free == 4 for n in own.inventory)
