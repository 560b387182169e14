"""The soak's later jobs arrive so that a trainer runs at every planned trainer kill."""

from __future__ import annotations

from tests.soak.faults import Planned
from tests.soak.soak import ARRIVAL_LEAD_S, arrival_times


def test_one_job_arrives_before_each_trainer_kill_latest_kills_first_the_rest_evenly():
    plan = [Planned(50, "kill-trainer", "delete"), Planned(100, "kill-operator", "sigkill"),
            Planned(300, "kill-trainer", "sigkill"), Planned(400, "kill-trainer", "delete")]
    assert arrival_times(plan, 2, 420) == [300 - ARRIVAL_LEAD_S, 400 - ARRIVAL_LEAD_S]
    assert arrival_times(plan, 4, 400) == [50 - ARRIVAL_LEAD_S, 160.0, 300 - ARRIVAL_LEAD_S, 400 - ARRIVAL_LEAD_S]


def test_without_trainer_kills_the_jobs_arrive_evenly_over_most_of_the_window():
    assert arrival_times([Planned(5, "kill-trainer", "delete")], 0, 100) == []
    assert arrival_times([Planned(10, "kill-trainer", "delete")], 1, 100) == [0.0]
    assert arrival_times([], 3, 400) == [80.0, 160.0, 240.0]
