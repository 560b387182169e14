"""Suspend and resume (lifecycle/suspend.py): runPolicy.suspend tears the gang down and keeps it
down; clearing it plans the gang anew."""

from __future__ import annotations

from operator_builders import at, running_world, world


def test_suspend_tears_down_and_resume_replans():
    w = running_world()
    w.job["spec"]["runPolicy"] = {"suspend": True}
    d = w.step(at(10))
    assert w.status["phase"] == "Suspended" and len(d.delete) == 4 and w.status["attempt"] == 1
    assert "startTime" not in w.status and "placement" not in w.status
    w.step(at(11))
    assert w.status["attempt"] == 1 and w.reasons().count("Suspended") == 1
    w.job["spec"]["runPolicy"] = {"suspend": False}
    d = w.step(at(20))
    assert d.action == "create" and w.status["phase"] == "Scheduling"
    assert w.reasons()[-3:] == ["Resumed", "Placed", "Admitted"]
    suspended = next(c for c in w.status["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "False"
    assert {p["metadata"]["labels"]["rlkube.io/attempt"] for p in w.pods.values()} == {"1"}


def test_created_suspended_never_makes_pods():
    w = world(runPolicy={"suspend": True})
    d = w.step(at(0))
    assert w.status["phase"] == "Suspended" and not d.create and w.status["attempt"] == 0


def test_a_suspended_job_restarts_nothing_while_it_stays_suspended():
    w = running_world(runPolicy={"backoffLimit": 0})
    w.job["spec"]["runPolicy"]["suspend"] = True
    w.step(at(10))
    for t in (20, 30, 40):
        d = w.step(at(t))
        assert d.action == "wait" and not d.delete and not d.create
    assert w.status["attempt"] == 1 and w.status["restarts"] == 0 and not w.pods
