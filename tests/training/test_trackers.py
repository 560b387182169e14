"""training.reportTo on a real run: a tiny DPO job reports to TensorBoard, MLflow and W&B (offline)
at once, and each tracker's files are read back with that library's own reader (TensorBoard's
EventAccumulator, MLflow's client, `wandb leet inspect`): the loss at every step, the config, the
run's summary. The same run's termination message carries the summary the operator copies into
status.summary.

The run is `python -m rlkube.runtime run`, in a session of its own: the entry point leaves with
os._exit once the run returns (infra/process_exit.py), so these files being whole shows that
nothing a tracker writes is left to the interpreter's teardown, and no process of the run (W&B's
service, torch's workers) is left behind after it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, records, runtime_env, tiny_config, write_config

STEPS = 3
TRACKER_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI",
               "MLFLOW_EXPERIMENT_NAME")


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One CLI run of STEPS steps reporting to every tracker: its out dir, losses, stdout and termination message."""
    tmp = tmp_path_factory.mktemp("tracked")
    cfg = tiny_config(tmp, training={"steps": STEPS, "reportTo": ["tensorboard", "mlflow", "wandb"]},
                      checkpoint={"dir": str(tmp / "ckpt"), "everySteps": STEPS, "keep": 1})
    env = {k: v for k, v in runtime_env(RLKUBE_TERMINATION_LOG=str(tmp / "termination")).items()
           if k not in TRACKER_ENV}  # offline, into outputDir: whatever the machine running the tests has set
    proc = subprocess.Popen([sys.executable, "-m", "rlkube.runtime", "run", str(write_config(tmp, cfg))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    left = processes_of_session(proc.pid)
    assert not left, f"processes of the run still running after it exited: {left}"
    recs = records(stdout)
    losses = [r["loss"] for r in recs if r.get("event") == "step"]
    assert len(losses) == STEPS and recs[-1]["event"] == "summary"
    return {"out": Path(cfg["outputDir"]), "losses": losses, "tmp": tmp,
            "termination": json.loads((tmp / "termination").read_text())["progress"]}


def processes_of_session(sid: int, wait_s: float = 15.0) -> list[str]:
    """Command lines of the processes still in session `sid`, after they had `wait_s` to leave
    (a child notices its parent's exit when its pipe closes)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    left.append((stat.parent / "cmdline").read_text().replace("\0", " ").strip())
            except (OSError, IndexError, ValueError):  # gone while we looked
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_tensorboard_has_the_loss_at_every_step_the_config_and_the_summary(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked_run["out"] / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx(tracked_run["losses"], rel=1e-6)
    assert [e.step for e in events.Scalars("tokensPerSecond")] == [1, 2, 3]
    assert [(e.step, e.value) for e in events.Scalars("summary/steps")] == [(STEPS, STEPS)]
    tags = events.Tags()["tensors"]
    assert "config/text_summary" in tags and "summary/text_summary" in tags
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "reportTo:" in text and "algorithm: dpo" in text


def test_mlflow_has_the_loss_history_the_config_as_params_and_the_summary(tracked_run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tracked_run['out'] / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rlkube")
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3]
    assert [m.value for m in history] == pytest.approx(tracked_run["losses"])
    assert run.info.status == "FINISHED" and run.info.run_name == "rlkube-dpo"
    assert run.data.params["training.steps"] == str(STEPS) and run.data.params["algorithm"] == "dpo"
    assert run.data.metrics["summary/steps"] == STEPS and run.data.metrics["summary/tokens"] > 0
    summary = client.download_artifacts(run.info.run_id, "summary.json", str(tracked_run["tmp"]))
    assert json.loads(Path(summary).read_text())["lastStep"] == STEPS
    # Its artifacts stay under outputDir, not in the working directory.
    assert (tracked_run["out"] / "mlflow" / "artifacts").is_dir()


def _wandb_inspect(path: Path, *args: str):
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", str(path), "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_wandb_leaves_an_offline_run_with_the_loss_at_every_step_the_config_and_the_summary(tracked_run):
    (run_dir,) = (tracked_run["out"] / "wandb").glob("offline-run-*")
    records = [json.loads(line) for line in _wandb_inspect(run_dir).splitlines() if line.startswith("{")]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["loss"] for h in history] == pytest.approx(tracked_run["losses"])
    state = json.loads(_wandb_inspect(run_dir, "--summary"))
    assert state["exit_code"] == 0 and state["config"]["training"]["reportTo"] == ["tensorboard", "mlflow", "wandb"]
    summaries = {k: v for r in records if r["type"] == "summary" for k, v in r["summary"]["update"].items()}
    assert summaries["summary/steps"] == STEPS and summaries["summary/lastStep"] == STEPS


def test_the_summary_reaches_the_termination_message_in_the_shape_of_status_summary(tracked_run):
    from rlkube.operator.api import RLTrainingJobStatus
    from rlkube.operator.render.status import summary_status

    summary = summary_status(tracked_run["termination"])
    assert (summary["steps"], summary["lastStep"], summary["gpus"]) == (STEPS, STEPS, 1)
    assert summary["checkpoint"].endswith("step-000000003") and summary["model"] == str(tracked_run["tmp"] / "ckpt" / "export")
    assert summary["tokensPerSecondPerGpu"] > 0 and "gpuBusyMean" not in summary  # not measured on a CPU
    parsed = RLTrainingJobStatus.model_validate({"summary": summary}).summary
    assert parsed.steps == STEPS and parsed.tokens == summary["tokens"]


def test_mlflow_reports_to_the_tracking_uri_when_one_is_set(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from rlkube.runtime.contract.config import RuntimeConfig
    from rlkube.runtime.trainers.trackers import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team")
    cfg = RuntimeConfig.model_validate(tiny_config(tmp_path, training={"reportTo": ["mlflow"]}))
    tracker = MlflowTracker(cfg)
    tracker.config({"training": {"lr": 0.5}})
    tracker.scalars(1, {"loss": 0.25})
    tracker.finish(None, 1)  # a run that did not succeed
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("team").experiment_id])
    assert run.info.status == "FAILED" and run.data.params == {"training.lr": "0.5"}
    assert run.data.metrics == {"loss": 0.25}
    assert not (Path(cfg.output_dir) / "mlflow").exists()
