"""training.reportTo without a tracker's files (tests/training/test_trackers.py reads those): the
names it takes and the errors it gives, a missing package said before any step with the extra to
install, and what a step hands a tracker (trainers/trackers.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rlkube.runtime import cli
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.contract.pod import EXIT_CONFIG
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.trainers import trackers
from rlkube.runtime.trainers.record import StepRecord, StepReport

DPO = StepReport(reward_mean="rewardChosen", gauges={})


def config(tmp_path, report_to) -> RuntimeConfig:
    return RuntimeConfig.model_validate({
        "algorithm": "dpo", "model": {"config": {"model_type": "qwen2"}}, "roles": {"actor": {"gpus": 1}},
        "data": {"source": "s", "format": "synthetic"}, "training": {"steps": 2, "reportTo": report_to},
        "progressPort": 0, "checkpoint": {"dir": str(tmp_path / "ckpt")}, "outputDir": str(tmp_path / "out")})


@pytest.mark.parametrize("report_to, trackers_on", [
    ([], []),
    (["none"], []),
    (["wandb", "tensorboard"], ["wandb", "tensorboard"]),
    (["tensorboard", "mlflow", "wandb"], ["tensorboard", "mlflow", "wandb"]),
])
def test_report_to_takes_trls_names_and_none_is_off(tmp_path, report_to, trackers_on):
    assert config(tmp_path, report_to).training.trackers() == trackers_on


def test_the_default_is_no_tracker(tmp_path):
    cfg = RuntimeConfig.model_validate({**config(tmp_path, []).model_dump(by_alias=True), "training": {}})
    assert cfg.training.report_to == [] and cfg.training.trackers() == []


@pytest.mark.parametrize("report_to, says", [
    (["tensorbord"], "training.reportTo[0]: Input should be 'tensorboard', 'mlflow', 'wandb' or 'none', "
                     "got 'tensorbord'"),
    (["none", "wandb"], "training: reportTo: 'none' turns the trackers off and cannot be listed with one, "
                        "got ['none', 'wandb']"),
    (["wandb", "wandb"], "training.reportTo: must not repeat a tracker (wandb), got ['wandb', 'wandb']"),
    ("wandb", "training.reportTo: Input should be a valid list, got 'wandb'"),
])
def test_a_wrong_report_to_names_the_field_and_what_is_valid(tmp_path, report_to, says):
    with pytest.raises(ValidationError) as err:
        config(tmp_path, report_to)
    assert cli.format_validation_error(err.value, "run.yaml") == [f"run.yaml: {says}"]


def _without(monkeypatch, *modules: str) -> None:
    real = trackers.installed
    monkeypatch.setattr(trackers, "installed", lambda module: module not in modules and real(module))


def test_a_missing_tracker_package_stops_the_run_before_torch_with_the_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("RLKUBE_TERMINATION_LOG", str(tmp_path / "termination"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _without(monkeypatch, "wandb", "sqlalchemy")
    cfg = config(tmp_path, ["tensorboard", "mlflow", "wandb"])
    want = ["training.reportTo: mlflow needs sqlalchemy, not installed here: pip install 'rlkube[tracking]'",
            "training.reportTo: wandb needs wandb, not installed here: pip install 'rlkube[tracking]'"]
    assert trackers.tracker_problems(cfg) == want
    with pytest.raises(ConfigError) as err:
        cli.run(cfg)  # the CLI's check, before the trainer (and torch) is imported
    assert str(err.value).splitlines() == want and err.value.field_path() == "training.reportTo"
    assert cli.run_in_process(cfg) == EXIT_CONFIG
    error = json.loads((tmp_path / "termination").read_text())["error"]
    assert error["exit"] == "config" and error["field"] == "training.reportTo"
    with pytest.raises(ConfigError):  # the loop's own check, for a run that did not come through the CLI
        trackers.Trackers(cfg, is_main=True)
    assert trackers.Trackers(cfg, is_main=False).open == []  # only rank 0 reports
    # A remote MLflow server needs no local store.
    assert trackers.tracker_problems(cfg, {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) == want[1:]


def test_a_step_hands_the_trackers_every_finite_number_of_its_log_line_by_path():
    rec = StepRecord.from_fields({"event": "step", "step": 3, "loss": 0.5, "tokens": 100, "seconds": 0.2,
                                  "tokensPerSecond": 500.0, "mfu": None, "accuracy": 1.0, "rewardChosen": 0.1,
                                  "name": "x", "flag": True, "inf": float("inf")}, DPO)
    rec.gpu_busy_phases, rec.phase_seconds = {"train": 0.9}, {"train": 0.15, "data_wait": 0.01}
    rec.eval = {"step": 3, "accuracy": 0.75}
    assert trackers.step_scalars(rec) == {
        "loss": 0.5, "tokens": 100, "seconds": 0.2, "tokensPerSecond": 500.0, "accuracy": 1.0,
        "rewardChosen": 0.1, "gpuBusyPhases/train": 0.9, "phaseSeconds/train": 0.15,
        "phaseSeconds/data_wait": 0.01, "eval/step": 3, "eval/accuracy": 0.75}


def test_mlflow_params_are_the_config_by_section_and_field(tmp_path):
    params = trackers.flat_params(trackers.run_config(config(tmp_path, ["mlflow"])))
    assert params["training.steps"] == "2" and params["training.reportTo"] == '["mlflow"]'
    assert params["algorithm"] == "dpo" and params["model.config.model_type"] == "qwen2"
