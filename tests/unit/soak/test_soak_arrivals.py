"""The soak's later jobs: a third arrive evenly over the window, the rest are held back for faults
that find no job training."""

from __future__ import annotations

from tests.soak.soak import arrival_times


def test_a_third_of_the_later_jobs_arrive_evenly_the_rest_are_held_back():
    assert arrival_times(3, 420) == [168.0]
    assert arrival_times(6, 300) == [80.0, 160.0]
    assert arrival_times(2, 400) == []  # all held back
    assert arrival_times(0, 100) == []


def test_a_fault_that_finds_no_job_left_gets_one_more_job(monkeypatch):
    from tests.e2e import deploy
    from tests.soak import soak

    applied = []
    monkeypatch.setattr(deploy, "apply", lambda cluster, job: applied.append(job["metadata"]["name"]))
    jobs = soak.job_specs(2, 10, 5, "t")

    def one_more():
        jobs.append(soak.job_specs(len(jobs) + 1, 10, 5, "t")[-1])
        return jobs[-1]

    arrivals = soak.Arrivals(None, jobs[1:], one_more)
    assert arrivals.apply_next("held back") and applied == ["soak1-grpo-t"]
    assert not arrivals.apply_next("on time")  # none left, and only a fault may ask for more
    assert arrivals.apply_next("a fault found none", extra=True)
    assert applied == ["soak1-grpo-t", "soak2-dpo-t"] and [j["metadata"]["name"] for j in jobs][-1] == "soak2-dpo-t"
    assert arrivals.extra == 1
