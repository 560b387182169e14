"""The components of the training loop (trainers/base.Trainer.train), each alone: the step
record's one conversion into the JSON log line, /progress and /metrics (trainers/record.py),
checked on a DPO-like and an RL-like record; the report that shows them (trainers/reporting.py:
phases, termination message, rank 0 only); the SIGTERM flag; the evaluation's cadence."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import NonFiniteLoss, Terminated
from rlkube.runtime.infra.progress import Progress
from rlkube.runtime.infra.terminal import LOG_FORMAT_ENV
from rlkube.runtime.trainers.record import StepRecord, StepReport, TrainResult
from rlkube.runtime.trainers.reporting import ProgressReport, RunConsole

DPO = StepReport(reward_mean="rewardChosen", gauges={"accuracy": "accuracy", "tokenBudget": "token_budget"})
RL = StepReport(reward_mean="rewardMean", gauges={"generationSeconds": "generationSeconds",
                                                  "trainingTokensPerSecond": "trainingTokensPerSecond"})


def dpo_fields(step: int = 1, **more) -> dict:
    return {"event": "step", "step": step, "loss": 0.69, "accuracy": 0.5, "rewardChosen": 0.01, "lr": 1e-4,
            "tokens": 1000, "seconds": 0.5, "tokensPerSecond": 2000.0, "mfu": None, "tokenBudget": 4096, **more}


def test_the_log_line_keeps_every_field_the_trainer_gave_and_adds_the_loops():
    fields = dpo_fields()
    rec = StepRecord.from_fields(fields, DPO)
    assert (rec.step, rec.loss, rec.tokens, rec.seconds, rec.tokens_per_second, rec.mfu) == (1, 0.69, 1000, 0.5,
                                                                                             2000.0, None)
    assert set(rec.fields) == {"event", "accuracy", "rewardChosen", "lr", "tokenBudget"}
    line = rec.log_line()
    assert {k: line[k] for k in fields} == fields
    assert set(line) - set(fields) == {"gpuUtilization", "gpuBusyPhases", "phaseSeconds"}
    assert "eval" not in line and "startupSeconds" not in line and "compileCache" not in line

    rec.gpu_utilization, rec.gpu_busy_phases, rec.phase_seconds = 0.9, {"optimizer": 0.8}, {"optimizer": 0.1}
    rec.eval, rec.startup_seconds = {"step": 1, "accuracy": 0.6}, {"import": 1.0, "total": 1.0}
    line = rec.log_line()
    assert line["gpuUtilization"] == 0.9 and line["eval"] == {"step": 1, "accuracy": 0.6}
    assert line["startupSeconds"] == {"import": 1.0, "total": 1.0}


def test_progress_fields_use_the_contract_names_and_the_trainers_report():
    rec = StepRecord.from_fields(dpo_fields(step=3), DPO)
    rec.gpu_utilization, rec.eval = 0.75, {"step": 3, "accuracy": 0.6, "loss": 0.5}
    shown = rec.progress_fields()
    assert shown[report.STEP] == 3 and shown[report.STEP_SECONDS] == 0.5 and shown[report.LOSS] == 0.69
    assert shown[report.REWARD_MEAN] == 0.01  # DPO shows its chosen reward as rewardMean
    assert shown[report.GPU_UTILIZATION] == 0.75
    assert shown[report.EVAL_STEP] == 3 and shown[report.EVAL_ACCURACY] == 0.6 and shown[report.EVAL_LOSS] == 0.5
    assert report.STARTUP_SECONDS not in shown  # only on the run's first step
    assert shown["tokens"] == 1000 and shown["extra"] == {"accuracy": 0.5, "token_budget": 4096}

    progress = Progress(total_steps=3, gpus=2)
    progress.update(**shown)
    doc = progress.snapshot()
    assert doc["step"] == 3 and doc["rewardMean"] == 0.01 and doc["evalAccuracy"] == 0.6
    metrics = generate_latest(progress.registry).decode()
    assert "rlkube_token_budget 4096.0" in metrics and "rlkube_tokens_total 1000.0" in metrics
    assert "rlkube_tokens_per_second_per_gpu 1000.0" in metrics


def test_extra_gauges_skip_fields_that_are_not_numbers():
    fields = {"event": "step", "algorithm": "grpo", "step": 1, "loss": None, "rewardMean": 0.25, "tokens": 10,
              "seconds": 1.0, "tokensPerSecond": 10.0, "mfu": 0.1, "generationSeconds": 0.4,
              "trainingTokensPerSecond": None, "value_loss": 0.3}
    rec = StepRecord.from_fields(fields, RL)
    shown = rec.progress_fields()
    assert shown["extra"] == {"generationSeconds": 0.4} and shown[report.REWARD_MEAN] == 0.25
    assert rec.log_line()["algorithm"] == "grpo" and rec.log_line()["value_loss"] == 0.3


def test_a_run_result_reads_any_field_of_its_steps():
    result = TrainResult(first_step=1)
    for step in (1, 2):
        result.steps.append(StepRecord.from_fields(dpo_fields(step=step, accuracy=0.5 * step), DPO))
    result.steps[1].eval = {"step": 2, "accuracy": 0.9}
    assert result.steps_run == 2 and result.losses == [0.69, 0.69]
    assert result.series("accuracy") == [0.5, 1.0] and [r["step"] for r in result.records] == [1, 2]
    assert result.evals == [{"step": 2, "accuracy": 0.9}]


def _run(tmp_path, monkeypatch, rank: int = 0) -> tuple[RuntimeConfig, DistContext]:
    """A 2-step run on 2 ranks as rank `rank` sees it, its termination message in tmp_path."""
    monkeypatch.setenv("RLKUBE_TERMINATION_LOG", str(tmp_path / "termination"))
    monkeypatch.delenv(LOG_FORMAT_ENV, raising=False)
    cfg = RuntimeConfig.model_validate({
        "algorithm": "dpo", "model": {"config": {"model_type": "qwen2"}}, "roles": {"actor": {"gpus": 1}},
        "data": {"source": "s", "format": "synthetic"}, "training": {"steps": 2}, "progressPort": 0,
        "checkpoint": {"dir": str(tmp_path / "ckpt")}})
    return cfg, DistContext(rank=rank, world_size=2, role_ranks={"actor": [0, 1]})


def _report(tmp_path, monkeypatch, rank: int = 0) -> ProgressReport:
    """Rank `rank`'s report of a 2-step run on 2 ranks (its console not entered: no summary)."""
    cfg, ctx = _run(tmp_path, monkeypatch, rank)
    return ProgressReport(cfg, ctx, RunConsole(cfg, ctx))


def _termination(tmp_path) -> dict:
    return json.loads((tmp_path / "termination").read_text())["progress"]


def test_the_report_goes_from_training_to_succeeded_and_leaves_its_last_report(tmp_path, monkeypatch, capsys):
    cfg, ctx = _run(tmp_path, monkeypatch)
    with RunConsole(cfg, ctx) as console, ProgressReport(cfg, ctx, console) as shown:
        shown.started({"event": "start", "startupSeconds": {"total": 1.0}}, start_step=0)
        assert shown.progress.snapshot()["phase"] == "training"
        rec = StepRecord.from_fields(dpo_fields(step=2), DPO)
        rec.busy_ranks = [{"step": 0.5}, {"step": None}]
        shown.step(rec)
        shown.checkpointed(0.25)
        shown.exported({"outputs": {"model": {"path": "/out", "step": 2}}})
        shown.succeeded()
    last = _termination(tmp_path)
    assert last["phase"] == "succeeded" and last["step"] == 2 and last["outputs"]["model"]["step"] == 2
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["event"] for line in lines] == ["start", "step", "summary"] and lines[1]["accuracy"] == 0.5
    summary = lines[2]  # stdout is not a terminal here: JSON lines, the summary last
    assert (summary["steps"], summary["lastStep"], summary["model"], summary["checkpoint"]) == (1, 2, "/out", None)
    metrics = generate_latest(shown.progress.registry).decode()
    assert 'rlkube_gpu_busy_ratio{phase="step",rank="0",role="actor"} 0.5' in metrics
    assert 'rank="1"' not in metrics and "rlkube_checkpoints_total 1.0" in metrics


def test_a_non_finite_loss_marks_the_report_failed_and_a_stop_leaves_it_training(tmp_path, monkeypatch):
    with pytest.raises(NonFiniteLoss), _report(tmp_path, monkeypatch) as shown:
        shown.started({"event": "start"}, start_step=0)
        raise NonFiniteLoss(1, "loss", float("nan"))
    assert _termination(tmp_path)["phase"] == "failed"
    with pytest.raises(Terminated), _report(tmp_path, monkeypatch) as shown:
        shown.started({"event": "start"}, start_step=0)
        raise Terminated(1)
    assert _termination(tmp_path)["phase"] == "training"


def test_other_ranks_report_nothing(tmp_path, monkeypatch, capsys):
    cfg, ctx = _run(tmp_path, monkeypatch, rank=1)
    with RunConsole(cfg, ctx) as console, ProgressReport(cfg, ctx, console) as shown:
        shown.started({"event": "start"}, start_step=0)
        shown.step(StepRecord.from_fields(dpo_fields(), DPO))
        shown.succeeded()
    assert shown.progress is None and capsys.readouterr().out == ""
    assert not (tmp_path / "termination").exists()


def test_sigterm_is_noted_and_agreed_at_a_step_boundary_and_the_old_handler_comes_back():
    import os
    import signal
    import threading

    from rlkube.runtime.infra.sigterm import SigtermFlag

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a signal handler is installed from the main thread only")
    before = signal.getsignal(signal.SIGTERM)
    with SigtermFlag() as flag:
        assert not flag.agreed(DistContext())
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not the end of the process
        assert flag.set and flag.agreed(DistContext())
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_evaluation_runs_when_due_in_its_busy_phase():
    from contextlib import contextmanager

    from rlkube.runtime.trainers.evaluation import Evaluation

    phases = []

    class Busy:
        @contextmanager
        def phase(self, name):
            phases.append(name)
            yield

    cfg = RuntimeConfig.model_validate({
        "algorithm": "dpo", "model": {"config": {"model_type": "qwen2"}}, "roles": {"actor": {"gpus": 1}},
        "data": {"source": "s", "format": "synthetic", "evalFraction": 0.1},
        "training": {"steps": 5, "evalEverySteps": 2}})
    evaluation = Evaluation(cfg, lambda: {"accuracy": 0.7}, Busy())
    assert [evaluation.after(n) for n in range(1, 6)] == [
        None, {"step": 2, "accuracy": 0.7}, None, {"step": 4, "accuracy": 0.7}, {"step": 5, "accuracy": 0.7}]
    assert phases == ["eval"] * 3
