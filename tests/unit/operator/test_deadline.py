"""The deadline (lifecycle/deadline.py): activeDeadlineSeconds since startTime fails the job,
counted from the resume of a suspended job, and a job that waits is woken when it falls."""

from __future__ import annotations

import pytest
from operator_builders import at, running_world


def test_deadline_fails_the_job():
    w = running_world(runPolicy={"activeDeadlineSeconds": 100})
    d = w.step(at(50))
    assert d.requeue_after == pytest.approx(50)
    d = w.step(at(100))
    assert w.status["phase"] == "Failed" and w.reasons()[-1] == "DeadlineExceeded" and len(d.delete) == 4


def test_a_job_without_a_deadline_is_not_woken():
    w = running_world()
    d = w.step(at(50))
    assert d.requeue_after is None and w.status["phase"] == "Running"


def test_the_deadline_counts_from_the_resume_of_a_suspended_job():
    w = running_world(runPolicy={"activeDeadlineSeconds": 100})
    w.job["spec"]["runPolicy"]["suspend"] = True
    w.step(at(90))
    assert w.status["phase"] == "Suspended" and "startTime" not in w.status
    w.job["spec"]["runPolicy"]["suspend"] = False
    w.step(at(200))                                 # resumed: a new plan, started at t=200
    assert w.status["startTime"] == "2026-12-02T12:03:20Z"
    w.step(at(201))
    w.bind_all()
    d = w.step(at(250))
    assert w.status["phase"] == "Running" and d.requeue_after == pytest.approx(50)
    w.step(at(300))
    assert w.status["phase"] == "Failed" and w.reasons()[-1] == "DeadlineExceeded"
