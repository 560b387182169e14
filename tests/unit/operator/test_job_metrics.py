"""The operator's job metrics (phase, restarts, admission wait) and status.progress's pace
(percent, etaSeconds, tokensPerSecondPerGpu): pure, from the statuses a reconcile writes."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import generate_latest

from rlkube.operator.controller.metrics import Metrics, admission_wait
from rlkube.operator.render.status import pace, progress_status

CREATED = "2026-12-02T12:00:00Z"


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_phase_gauges_and_counts_follow_the_status():
    m = Metrics()
    m.observe_job("a", "j1", {}, {"phase": "Pending"}, CREATED)
    m.observe_job("a", "j2", {}, {"phase": "Running"}, CREATED)
    m.observe_job("b", "j1", {}, {"phase": "Running"}, CREATED)
    assert value(m, "rlkube_operator_jobs", phase="Running") == 2
    assert value(m, "rlkube_operator_jobs", phase="Pending") == 1
    assert value(m, "rlkube_operator_jobs", phase="Failed") == 0  # every phase has a series
    assert value(m, "rlkube_operator_job_phase", namespace="a", rltj="j1", phase="Pending") == 1
    assert value(m, "rlkube_operator_job_phase", namespace="a", rltj="j1", phase="Running") == 0

    m.observe_job("a", "j1", {"phase": "Pending"}, {"phase": "Running"}, CREATED)
    assert value(m, "rlkube_operator_jobs", phase="Running") == 3
    assert value(m, "rlkube_operator_jobs", phase="Pending") == 0

    m.forget_job("a", "j1")
    m.forget_job("a", "j1")  # gone twice (deleting, then gone): no error
    assert value(m, "rlkube_operator_jobs", phase="Running") == 2
    assert value(m, "rlkube_operator_job_phase", namespace="a", rltj="j1", phase="Running") is None
    assert b'rltj="j1"' in generate_latest(m.registry)  # b/j1 stays


def test_restarts_counter_equals_status_restarts_and_never_goes_back():
    m = Metrics()
    m.observe_job("a", "j", {}, {"phase": "Running", "restarts": 0}, CREATED)
    assert value(m, "rlkube_operator_job_restarts_total", namespace="a", rltj="j") == 0
    m.observe_job("a", "j", {}, {"phase": "Restarting", "restarts": 2}, CREATED)
    m.observe_job("a", "j", {}, {"phase": "Running", "restarts": 2}, CREATED)
    assert value(m, "rlkube_operator_job_restarts_total", namespace="a", rltj="j") == 2
    # A restarted operator starts at the status' count: no reset for Prometheus to see.
    fresh = Metrics()
    fresh.observe_job("a", "j", {}, {"phase": "Running", "restarts": 2}, CREATED)
    assert value(fresh, "rlkube_operator_job_restarts_total", namespace="a", rltj="j") == 2


@pytest.mark.parametrize("old, new, expected", [
    ({}, {"admissionTime": "2026-12-02T12:05:30Z", "attempt": 0}, 330.0),
    ({"admissionTime": "2026-12-02T12:05:30Z"}, {"admissionTime": "2026-12-02T12:05:30Z"}, None),  # already seen
    ({}, {"admissionTime": "2026-12-02T13:00:00Z", "attempt": 1}, None),  # a restart, not a wait in line
    ({}, {"phase": "Pending"}, None),
    ({}, {"admissionTime": "2026-12-02T11:59:00Z"}, 0.0),  # clock skew: never negative
])
def test_admission_wait_is_observed_once_for_the_first_gang(old, new, expected):
    assert admission_wait(old, new, CREATED) == expected


def test_admission_wait_lands_in_the_histogram():
    m = Metrics()
    m.observe_job("a", "j", {}, {"phase": "Scheduling", "admissionTime": "2026-12-02T12:01:00Z"}, CREATED)
    assert value(m, "rlkube_operator_admission_wait_seconds_count") == 1
    assert value(m, "rlkube_operator_admission_wait_seconds_sum") == 60
    assert value(m, "rlkube_operator_admission_wait_seconds_bucket", le="60.0") == 1
    assert value(m, "rlkube_operator_admission_wait_seconds_bucket", le="30.0") == 0


@pytest.mark.parametrize("progress, gpus, expected", [
    ({"step": 25, "totalSteps": 100, "stepSeconds": 2.0, "tokensPerSecond": 8000.0}, 4,
     {"percent": 25.0, "etaSeconds": 150, "tokensPerSecondPerGpu": 2000.0}),
    ({"step": 1, "totalSteps": 3}, 2, {"percent": 33.3}),                    # no pace yet: no ETA
    ({"step": 5, "totalSteps": 4, "stepSeconds": 1.0}, None, {"percent": 100.0, "etaSeconds": 0}),
    ({"step": 0, "totalSteps": 0, "tokensPerSecond": 10.0}, 0, {}),          # nothing to divide by
    ({"tokensPerSecond": 300.0}, 3, {"tokensPerSecondPerGpu": 100.0}),
    ({"step": 3, "totalSteps": 10, "stepSeconds": 0.3333}, 1, {"percent": 30.0, "etaSeconds": 2}),
])
def test_pace_from_steps_step_time_and_gpus(progress, gpus, expected):
    assert pace(progress, gpus) == expected


def test_progress_status_writes_the_pace_of_the_report():
    report = {"phase": "training", "step": 10, "totalSteps": 40, "stepSeconds": 1.23456, "tokensPerSecond": 1000.04}
    out = progress_status(report, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), gpus=8)
    assert out["stepSeconds"] == 1.235 and out["percent"] == 25.0
    assert out["etaSeconds"] == round(30 * 1.235) and out["tokensPerSecondPerGpu"] == 125.0
    assert "tokensPerSecondPerGpu" not in progress_status(report, dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))
