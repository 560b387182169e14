"""A finished job (lifecycle/ttl.py): Succeeded and Failed are final, remaining pods are deleted,
and ttlSecondsAfterFinished deletes the job itself."""

from __future__ import annotations

from operator_builders import at, running_world


def test_all_succeeded_then_ttl_deletes_the_job():
    w = running_world(runPolicy={"ttlSecondsAfterFinished": 60})
    for name in w.pods:
        w.set_pod(name, "Succeeded", exit_code=0)
    w.step(at(10))
    assert w.status["phase"] == "Succeeded" and w.reasons()[-1] == "Succeeded"
    assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in w.status["conditions"])
    d = w.step(at(30))
    assert not d.delete_job and d.requeue_after == 40
    d = w.step(at(70))
    assert d.delete_job and w.reasons()[-1] == "TTLExpired"


def test_failed_job_deletes_remaining_running_pods_and_stays_failed():
    w = running_world()
    names = sorted(w.pods)
    w.set_pod(names[0], "Failed", exit_code=3)
    d = w.step(at(5))
    assert sorted(d.delete) == names[1:] and names[0] in w.pods
    w.step(at(6))
    assert w.status["phase"] == "Failed"


def test_without_a_ttl_a_finished_job_stays():
    w = running_world()
    for name in w.pods:
        w.set_pod(name, "Succeeded", exit_code=0)
    w.step(at(10))
    d = w.step(at(100_000))
    assert w.status["phase"] == "Succeeded" and not d.delete_job and d.requeue_after is None
    assert "TTLExpired" not in w.reasons()
