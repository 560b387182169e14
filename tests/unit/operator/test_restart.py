"""Restart with backoff (lifecycle/restart.py): a failure that counts against backoffLimit
restarts the whole gang with attempt+1 after an exponential backoff, and fails the job once the
limit is reached; "backoffLimit reached: fail, else restart" is decided there for every cause."""

from __future__ import annotations

import pytest
from operator_builders import at, running_world

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import pod_views
from rlkube.operator.lifecycle import restart
from rlkube.operator.lifecycle.decider import AttemptState, Decider


def decider(w, now: float) -> Decider:
    view = w.view()
    return Decider(view, pod_views(list(w.pods.values())), at(now), None, None, w.settings,
                   AttemptState.from_status(view.status))


def test_backoff_doubles_from_the_base_and_is_capped():
    settings = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=60)
    assert [restart.backoff_seconds(n, settings) for n in range(1, 6)] == [10, 20, 40, 60, 60]
    assert restart.backoff_seconds(0, settings) == 10  # never below the base
    assert lifecycle.backoff_seconds is restart.backoff_seconds


def test_below_the_limit_a_counted_failure_restarts_the_gang_after_the_backoff():
    w = running_world(runPolicy={"backoffLimit": 2})
    d = decider(w, 5)
    decision = restart.restart_or_fail(d, "NodeLost", "node a is gone",
                                       restart_message="node a is gone; re-planning the gang away from it")
    assert decision.action == "restart" and decision.status["phase"] == "Restarting"
    assert decision.status["attempt"] == 1 and decision.status["restarts"] == 1
    assert decision.status["nextAttemptTime"] == "2026-12-02T12:00:15Z"  # FAST: 10 s base
    assert sorted(decision.delete) == sorted(w.pods)
    assert [(e.type, e.reason, e.message) for e in decision.events] == [
        ("Warning", "NodeLost", "node a is gone; re-planning the gang away from it; restart 1/2 in 10s")]


@pytest.mark.parametrize("event_at_limit, reasons", [(False, ["BackoffLimitExceeded"]),
                                                     (True, ["NodeLost", "BackoffLimitExceeded"])])
def test_at_the_limit_a_counted_failure_fails_the_job(event_at_limit, reasons):
    w = running_world(runPolicy={"backoffLimit": 0})
    decision = restart.restart_or_fail(decider(w, 5), "NodeLost", "node a is gone", event_at_limit=event_at_limit)
    assert decision.action == "fail" and decision.status["phase"] == "Failed"
    assert decision.status["restarts"] == 0 and decision.status["attempt"] == 0
    assert [e.reason for e in decision.events] == reasons
    assert decision.events[-1].message == "node a is gone; backoffLimit 0 reached"


def test_the_backoff_is_waited_out_before_the_next_attempt():
    w = running_world()
    w.set_pod(sorted(w.pods)[0], "Failed", exit_code=1)
    w.step(at(5))                                   # restart 1: next attempt at t=15
    assert restart.wait_out(decider(w, 15)) is None  # over: the next attempt is planned
    waiting = restart.wait_out(decider(w, 6))
    assert waiting.status["phase"] == "Restarting" and waiting.requeue_after == pytest.approx(9)


@pytest.mark.parametrize("code, phase, reason", [(3, "Failed", "ExitCode"), (4, "Failed", "ExitCode"),
                                                 (1, "Restarting", "PodFailed"), (143, "Restarting", "PodFailed"),
                                                 (137, "Restarting", "PodFailed")])
def test_exit_codes(code, phase, reason):
    w = running_world()
    name = sorted(w.pods)[2]
    w.set_pod(name, "Failed", exit_code=code)
    others = sorted(n for n in w.pods if n != name)
    d = w.step(at(5))
    assert w.status["phase"] == phase and w.events[-1].reason == reason
    if phase == "Failed":
        assert w.status["completionTime"] == "2026-12-02T12:00:05Z"
        assert sorted(d.delete) == others and list(w.pods) == [name]  # the failed pod stays for its logs
        assert w.status["attempt"] == 0 and w.status["restarts"] == 0
    else:
        assert w.status["attempt"] == 1 and w.status["restarts"] == 1
        assert w.status["nextAttemptTime"] == "2026-12-02T12:00:15Z"
        assert not w.pods  # the whole gang goes


def test_gang_restart_backoff_then_new_attempt_with_same_names():
    w = running_world()
    names = sorted(w.pods)
    w.set_pod(names[0], "Failed", exit_code=1)
    w.step(at(5))
    d = w.step(at(6))
    assert w.status["phase"] == "Restarting" and 8.9 < d.requeue_after <= 9.0 and not d.create
    d = w.step(at(15))
    assert d.action == "create" and sorted(w.pods) == names
    assert {p["metadata"]["labels"]["rlkube.io/attempt"] for p in w.pods.values()} == {"1"}
    env = {e["name"]: e.get("value") for e in w.pods[names[0]]["spec"]["containers"][0]["env"]}
    assert env["RLKUBE_ATTEMPT"] == "1"


def test_backoff_limit_fails_the_job():
    w = running_world(runPolicy={"backoffLimit": 1})
    w.set_pod(sorted(w.pods)[0], "Failed", exit_code=1)
    w.step(at(5))
    w.step(at(15))
    w.step(at(16))
    w.bind_all()
    w.step(at(17))
    w.set_pod(sorted(w.pods)[1], "Failed", exit_code=1)
    w.step(at(18))
    assert w.status["phase"] == "Failed" and w.events[-1].reason == "BackoffLimitExceeded"
    assert w.status["restarts"] == 1
