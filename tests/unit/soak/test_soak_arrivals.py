"""The soak's later jobs: one held back per planned trainer kill, the rest evenly over the window."""

from __future__ import annotations

from tests.soak.faults import Planned
from tests.soak.soak import arrival_times


def test_one_job_is_held_back_per_trainer_kill_and_the_rest_arrive_evenly():
    plan = [Planned(50, "kill-trainer", "delete"), Planned(100, "kill-operator", "sigkill"),
            Planned(300, "kill-trainer", "sigkill")]
    assert arrival_times(plan, 3, 400) == [160.0]
    assert arrival_times(plan, 4, 300) == [80.0, 160.0]
    assert arrival_times(plan, 1, 400) == []  # fewer jobs than kills: all held back


def test_without_trainer_kills_every_later_job_arrives_on_time():
    assert arrival_times([Planned(5, "kill-operator", "sigkill")], 3, 400) == [80.0, 160.0, 240.0]
    assert arrival_times([], 0, 100) == []
