"""status.outputs: the model a run exported, copied from rank 0's /progress report, kept between
polls and attempts, and announced once by an Event `Exported` naming its path and step."""

from __future__ import annotations

import json

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api import RLTrainingJobStatus
from rlkube.operator.render.status import exported_message, outputs_status, status_patch

FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15)
EXPORT = {"model": {"path": "/checkpoints/export", "step": 40}}


def running_world() -> World:
    w = World(job(), [node("a", 4), node("b", 4)], FAST)
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(3))
    assert w.status["phase"] == "Running", w.status
    return w


@pytest.mark.parametrize("report, expected", [
    ({"step": 40, "outputs": EXPORT}, EXPORT),
    ({"step": 40}, None),
    ({"outputs": None}, None),
    ({"outputs": {"model": {"path": "", "step": 1}}}, None),
    ({"outputs": {"model": {"path": "/x", "step": -1}}}, None),
    ({"outputs": {"model": {"path": "/x", "step": True}}}, None),
    ({"outputs": {"model": {"path": "/x" * 600, "step": 1}}}, None),  # longer than the schema allows
    ({"outputs": {"model": {"path": "/x", "step": 3, "extra": 1}}}, {"model": {"path": "/x", "step": 3}}),
])
def test_outputs_from_a_progress_report(report, expected):
    assert outputs_status(report) == expected
    if expected is not None:  # what the function writes is what the CRD's schema accepts
        assert RLTrainingJobStatus.model_validate({"outputs": expected}).outputs.model.step == expected["model"]["step"]


def test_exported_message_only_when_the_model_changes():
    assert exported_message({}, {"outputs": EXPORT}) == "model exported to /checkpoints/export at step 40"
    assert exported_message({"outputs": EXPORT}, {"outputs": EXPORT}) is None
    later = {"model": {"path": "/checkpoints/export", "step": 80}}
    assert exported_message({"outputs": EXPORT}, {"outputs": later}) == "model exported to /checkpoints/export at step 80"
    assert exported_message({"outputs": EXPORT}, {}) is None
    assert status_patch({"outputs": EXPORT}, {"outputs": later}) == {"outputs": {"model": {"step": 80}}}


def test_outputs_land_in_status_with_one_exported_event_and_survive_later_reports():
    w = running_world()
    w.step(at(10), progress={"step": 40, "totalSteps": 80, "outputs": EXPORT})
    assert w.status["outputs"] == EXPORT
    assert [e.message for e in w.events if e.reason == "Exported"] == ["model exported to /checkpoints/export at step 40"]
    w.step(at(11), progress={"step": 41, "totalSteps": 80})  # a report without outputs keeps them
    w.step(at(12))
    assert w.status["outputs"] == EXPORT
    assert [e.reason for e in w.events].count("Exported") == 1


def test_the_final_export_in_the_termination_message_reaches_status_and_an_event():
    w = running_world()
    final = json.dumps({"progress": {"phase": "succeeded", "step": 80, "totalSteps": 80,
                                     "outputs": {"model": {"path": "/checkpoints/export", "step": 80}}}})
    for i, name in enumerate(sorted(w.pods)):
        w.set_pod(name, "Succeeded", exit_code=0, message=final if i == 0 else "")
    w.step(at(12))
    assert w.status["phase"] == "Succeeded"
    assert w.status["outputs"] == {"model": {"path": "/checkpoints/export", "step": 80}}
    exported = [e for e in w.events if e.reason == "Exported"]
    assert len(exported) == 1 and exported[0].type == "Normal" and "step 80" in exported[0].message


LORA = {"model": {"path": "/checkpoints/export", "step": 30},
        "adapter": {"path": "/checkpoints/export/adapter", "step": 30}}


def test_a_lora_runs_adapter_lands_in_status_next_to_its_merged_model():
    assert outputs_status({"outputs": LORA}) == LORA
    adapter_only = {"adapter": LORA["adapter"]}
    assert outputs_status({"outputs": {**adapter_only, "model": {"path": "", "step": 30}}}) == adapter_only
    parsed = RLTrainingJobStatus.model_validate({"outputs": adapter_only}).outputs
    assert parsed.model is None and parsed.adapter.path == "/checkpoints/export/adapter"
    assert exported_message({}, {"outputs": adapter_only}) == (
        "LoRA adapter exported to /checkpoints/export/adapter at step 30")
    assert exported_message({}, {"outputs": LORA}) == (
        "model exported to /checkpoints/export at step 30; LoRA adapter exported to /checkpoints/export/adapter "
        "at step 30")


def test_the_latest_evaluation_reaches_status_progress():
    from rlkube.operator.render.status import progress_status

    report = {"step": 40, "evalStep": 40, "evalAccuracy": 0.75, "evalMargin": 0.3, "evalLoss": 0.5,
              "evalRewardMean": -0.25}
    out = progress_status(report, at(0))
    assert {k: out[k] for k in ("evalStep", "evalAccuracy", "evalRewardMean")} == {
        "evalStep": 40, "evalAccuracy": 0.75, "evalRewardMean": -0.25}
    assert "evalMargin" not in out and "evalLoss" not in out  # /progress and /metrics only
    assert RLTrainingJobStatus.model_validate({"progress": out}).progress.eval_reward_mean == -0.25


PLAN = "71.3 of 79.2 GiB: actorWeights 2.3, actorAdamW 4.6; 41.9 GiB left for batches: micro-batches of 19469 tokens"


def test_the_memory_plan_reaches_status_progress_with_one_event_per_plan():
    w = running_world()
    w.step(at(10), progress={"step": 0, "totalSteps": 80, "memoryPlan": PLAN})
    assert w.status["progress"]["memoryPlan"] == PLAN
    w.step(at(11), progress={"step": 1, "totalSteps": 80, "memoryPlan": PLAN})
    plans = [e for e in w.events if e.reason == "MemoryPlan"]
    assert len(plans) == 1 and plans[0].type == "Normal" and plans[0].message == PLAN
    other = PLAN.replace("19469", "9000")  # a restarted trainer's new plan is announced again
    w.step(at(12), progress={"step": 2, "totalSteps": 80, "memoryPlan": other})
    assert [e.message for e in w.events if e.reason == "MemoryPlan"] == [PLAN, other]
    assert RLTrainingJobStatus.model_validate({"progress": w.status["progress"]}).progress.memory_plan == other
