"""The run's summary on its way to status.summary: it joins rank 0's last report once the last
checkpoint is committed and is left in the termination message again, in the fields the contract
names; a termination message over the kubelet's limit drops the breakdowns first
(trainers/reporting.py, trainers/summary.py, infra/progress.py)."""

from __future__ import annotations

import json

import pytest

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.progress import Progress, write_termination_message
from rlkube.runtime.infra.terminal import LOG_FORMAT_ENV
from rlkube.runtime.trainers.record import StepRecord, StepReport
from rlkube.runtime.trainers.reporting import ProgressReport, RunConsole
from rlkube.runtime.trainers.summary import RunTally, status_summary

DPO = StepReport(reward_mean="rewardChosen", gauges={})


def _console(tmp_path, monkeypatch) -> tuple[RuntimeConfig, DistContext]:
    monkeypatch.setenv("RLKUBE_TERMINATION_LOG", str(tmp_path / "termination"))
    monkeypatch.delenv(LOG_FORMAT_ENV, raising=False)
    cfg = RuntimeConfig.model_validate({
        "algorithm": "dpo", "model": {"config": {"model_type": "qwen2"}}, "roles": {"actor": {"gpus": 1}},
        "data": {"source": "s", "format": "synthetic"}, "training": {"steps": 2}, "progressPort": 0,
        "checkpoint": {"dir": str(tmp_path / "ckpt")}})
    return cfg, DistContext(rank=0, world_size=2, role_ranks={"actor": [0, 1]})


def test_the_summary_joins_the_last_report_and_the_termination_message(tmp_path, monkeypatch, capsys):
    cfg, ctx = _console(tmp_path, monkeypatch)
    with RunConsole(cfg, ctx) as console, ProgressReport(cfg, ctx, console) as shown:
        shown.started({"event": "start", "startupSeconds": {"total": 1.0}}, start_step=0)
        for step in (1, 2):
            shown.step(StepRecord.from_fields({"event": "step", "step": step, "loss": 0.6, "tokens": 1000,
                                               "seconds": 0.5, "tokensPerSecond": 2000.0, "mfu": None}, DPO))
        shown.exported({"outputs": {"model": {"path": "/out/export", "step": 2}}})
        shown.succeeded()
        assert shown.progress.snapshot()[report.SUMMARY] is None  # not before the last checkpoint is committed
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    last = json.loads((tmp_path / "termination").read_text())["progress"]
    assert last["phase"] == "succeeded" and set(last[report.SUMMARY]) == set(report.SUMMARY_FIELDS)
    assert last[report.SUMMARY] == status_summary(printed)
    assert (last["summary"]["steps"], last["summary"]["tokens"], last["summary"]["gpus"],
            last["summary"]["model"]) == (2, 2000, 2, "/out/export")


def test_a_run_that_did_not_succeed_reports_no_summary(tmp_path, monkeypatch):
    cfg, ctx = _console(tmp_path, monkeypatch)
    with pytest.raises(RuntimeError), RunConsole(cfg, ctx) as console, ProgressReport(cfg, ctx, console) as shown:
        shown.started({"event": "start"}, start_step=0)
        raise RuntimeError("crash")
    assert json.loads((tmp_path / "termination").read_text())["progress"][report.SUMMARY] is None


def test_the_summary_event_and_the_reported_summary_agree_on_their_fields():
    s = RunTally(gpus=1, memory_total=None).summary(None)
    assert set(s) - {"event", "load"} == set(report.SUMMARY_FIELDS)


def test_a_termination_message_over_the_limit_drops_the_breakdowns_before_the_summary(tmp_path):
    progress = Progress(10, attempt=0, gpus=1)
    long = "/checkpoints/" + "x" * 900
    summary = {key: None for key in report.SUMMARY_FIELDS} | {"steps": 10, "checkpoint": long, "model": long}
    progress.update(step=10, memoryPlan="m" * report.MEMORY_PLAN_MAX_CHARS, outputs={"model": {"path": long, "step": 10}},
                    phaseSeconds={f"phase{i}": 1.0 for i in range(40)}, summary=summary)
    path = tmp_path / "termination"
    assert write_termination_message(progress, str(path))
    body = path.read_text()
    assert len(body.encode()) <= report.TERMINATION_LOG_MAX_BYTES
    last = json.loads(body)["progress"]
    assert last["summary"] == summary and last["outputs"]["model"]["path"] == long and last["step"] == 10
    assert "phaseSeconds" not in last and "memoryPlan" not in last
