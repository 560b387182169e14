"""The soak's later jobs: a third arrive evenly over the window, the rest are held back for faults
that find no job training."""

from __future__ import annotations

from tests.soak.soak import arrival_times


def test_a_third_of_the_later_jobs_arrive_evenly_the_rest_are_held_back():
    assert arrival_times(3, 420) == [168.0]
    assert arrival_times(6, 300) == [80.0, 160.0]
    assert arrival_times(2, 400) == []  # all held back
    assert arrival_times(0, 100) == []
