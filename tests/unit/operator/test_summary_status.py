"""status.summary: the run's summary, copied from the last report rank 0 left (its termination
message) once the run succeeded, in the shape the CRD declares, and kept by later reconciles."""

from __future__ import annotations

import json

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api import RLTrainingJobStatus
from rlkube.operator.render.status import status_patch, summary_status

FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15)
SUMMARY = {"steps": 80, "firstStep": 1, "lastStep": 80, "tokens": 5_242_880, "gpus": 8, "wallSeconds": 912.4,
           "startupSeconds": 61.2, "trainingSeconds": 840.0, "tokensPerSecondPerGpu": 780.19047619,
           "gpuBusyMean": 0.93, "peakMemoryFraction": 0.81, "peakMemoryGiB": 64.0,
           "checkpoint": "/checkpoints/step-000000080", "model": "/checkpoints/export", "adapter": None}
IN_STATUS = {**{k: v for k, v in SUMMARY.items() if v is not None}, "tokensPerSecondPerGpu": 780.1905}


def running_world() -> World:
    w = World(job(), [node("a", 4), node("b", 4)], FAST)
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(3))
    assert w.status["phase"] == "Running", w.status
    return w


@pytest.mark.parametrize("summary, expected", [
    (SUMMARY, IN_STATUS),
    (None, None),
    ("done", None),
    ({}, None),
    ({"steps": -1, "tokens": True, "gpus": 1.5, "wallSeconds": float("nan"), "gpuBusyMean": -0.1,
      "trainingSeconds": float("inf"), "checkpoint": "", "model": "/m" * 600, "lastStep": 3}, {"lastStep": 3}),
    ({"steps": 2, "unknown": 1, "load": ["from transformers import ..."]}, {"steps": 2}),
])
def test_summary_from_a_report(summary, expected):
    assert summary_status({"step": 80, "summary": summary}) == expected
    if expected is not None:  # what the function writes is what the CRD's schema accepts
        parsed = RLTrainingJobStatus.model_validate({"summary": expected}).summary
        assert parsed.model_dump(by_alias=True, exclude_none=True) == expected


def test_the_summary_in_the_termination_message_reaches_status_and_stays():
    w = running_world()
    w.step(at(10), progress={"step": 40, "totalSteps": 80})  # a report while training has none
    assert "summary" not in w.status
    before = dict(w.status)
    final = json.dumps({"progress": {"phase": "succeeded", "step": 80, "totalSteps": 80,
                                     "outputs": {"model": {"path": "/checkpoints/export", "step": 80}},
                                     "summary": SUMMARY}})
    for i, name in enumerate(sorted(w.pods)):
        w.set_pod(name, "Succeeded", exit_code=0, message=final if i == 0 else "")
    w.step(at(12))
    assert w.status["phase"] == "Succeeded" and w.status["summary"] == IN_STATUS
    assert status_patch(before, w.status)["summary"] == IN_STATUS
    w.step(at(13))  # a finished job's status is not rewritten: the summary stays
    assert w.status["summary"] == IN_STATUS
    parsed = RLTrainingJobStatus.model_validate(w.status).summary
    assert (parsed.tokens_per_second_per_gpu, parsed.peak_memory_gib, parsed.adapter) == (780.1905, 64.0, None)
