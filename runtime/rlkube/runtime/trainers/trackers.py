"""The experiment trackers of `training.reportTo`: TensorBoard, MLflow and Weights & Biases, as a
TRL user knows them, written by rank 0 only.

Each tracker gets the run's config once when training starts, every finite number of every
step's record (record.StepRecord.log_line, nested fields as `parent/child`) at that step, and the
run's summary (trainers/summary.py) as `summary/<name>` when it ends. trainers/reporting.RunConsole
drives them from the same points that print the step's log line and the summary, so what a
tracker shows is what the log says.

- tensorboard: event files in <outputDir>/tensorboard, written with tensorboardX. It writes the
  same event files as torch.utils.tensorboard without needing the tensorboard package (its web
  server, grpcio and a data server of its own); `tensorboard --logdir` reads them.
- mlflow: the run goes to MLFLOW_TRACKING_URI when it is set, else to the SQLite store
  <outputDir>/mlflow/mlflow.db with artifacts beside it (MLflow 3 refuses its plain-file store
  unless told to, and `mlflow ui` opens a SQLite store as it is); the experiment is
  MLFLOW_EXPERIMENT_NAME, else "rlkube". The config becomes the run's params, the summary its
  `summary/` metrics and a summary.json artifact.
- wandb: online when WANDB_API_KEY is set (or WANDB_MODE says so), else an offline run under
  <outputDir>/wandb that `wandb sync` uploads later; the project is WANDB_PROJECT, else "rlkube".

A tracker whose package is missing is the user's mistake, said before the run starts
(`tracker_problems`, which the CLI checks before torch loads): a ConfigError naming
training.reportTo and the extra to install. This module imports no tracker package until a
tracker is opened, and nothing of torch.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.log import log

if TYPE_CHECKING:
    from rlkube.runtime.trainers.record import StepRecord

FIELD = "training.reportTo"
INSTALL = "pip install 'rlkube[tracking]'"
SUMMARY_PREFIX = "summary/"


def flat_numbers(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number in `values`, nested mappings flattened to `parent/child` names (booleans,
    strings, lists and None are left out)."""
    out: dict[str, float] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_numbers(value, f"{name}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = value
    return out


def step_scalars(rec: StepRecord) -> dict[str, float]:
    """The numbers a tracker logs of a step: its log line's, less the step number itself (the axis)."""
    line = {k: v for k, v in rec.log_line().items() if k not in ("event", "step")}
    return flat_numbers(line)


def run_config(cfg: RuntimeConfig) -> dict[str, Any]:
    """The config as the user wrote it (camelCase), for a tracker's config or params."""
    return cfg.model_dump(mode="json", by_alias=True, exclude_none=True)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`config` as MLflow params: `section.field` names, lists and scalars as JSON text."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


class Tracker:
    """One experiment tracker of a run. `open` starts its run; the loop then calls `config` once,
    `scalars` after every step and `finish` once (summary None: the run did not succeed)."""

    # The modules a tracker needs, each with the package pip installs it from.
    NEEDS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.output_dir)

    @classmethod
    def needs(cls, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        return cls.NEEDS

    def config(self, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def scalars(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def finish(self, summary: dict[str, Any] | None, step: int) -> None:
        """The run's end: its summary (None when it failed or stopped) after `step` steps."""
        raise NotImplementedError


class TensorBoardTracker(Tracker):
    NEEDS = (("tensorboardX", "tensorboardX"),)

    def __init__(self, cfg: RuntimeConfig) -> None:
        super().__init__(cfg)
        from tensorboardX import SummaryWriter

        self.path = self.dir / "tensorboard"
        self.writer = SummaryWriter(logdir=str(self.path))
        log.info("tensorboard: event files in %s (tensorboard --logdir %s)", self.path, self.path)

    def config(self, config: dict[str, Any]) -> None:
        # Indented four spaces: TensorBoard's text tab renders markdown, and keeps a code block as is.
        text = "\n".join("    " + line for line in yaml.safe_dump(config, sort_keys=False).splitlines())
        self.writer.add_text("config", text, 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def finish(self, summary: dict[str, Any] | None, step: int) -> None:
        if summary is not None:
            self.scalars(step, {SUMMARY_PREFIX + k: v for k, v in flat_numbers(summary).items()})
            self.writer.add_text("summary", "    " + json.dumps(summary, indent=1).replace("\n", "\n    "), step)
        self.writer.close()  # flushes


class MlflowTracker(Tracker):
    """MLflow's client writes each call through to its store (a SQLite transaction, or a request to
    a server: tens of milliseconds), so a thread of its own writes the steps' metrics, every step
    that waited in one call, and rank 0's loop only queues them. (MLflow's own asynchronous
    logging took seconds to drain a short run's queue.)"""

    NEEDS = (("mlflow", "mlflow-skinny"),)
    LOCAL_STORE = (("sqlalchemy", "sqlalchemy"), ("alembic", "alembic"))  # a SQLite store needs both
    BATCH = 100  # MLflow's most params in one log_batch (and metrics: its limit is 1000)

    @classmethod
    def needs(cls, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        return cls.NEEDS if env.get("MLFLOW_TRACKING_URI") else cls.NEEDS + cls.LOCAL_STORE

    def __init__(self, cfg: RuntimeConfig) -> None:
        super().__init__(cfg)
        from mlflow.tracking import MlflowClient

        local = self.dir.resolve() / "mlflow"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            local.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{local / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "rlkube"
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            experiment = found.experiment_id
        else:  # a local store keeps its artifacts beside it, not in the working directory
            artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else (local / "artifacts").as_uri()
            experiment = self.client.create_experiment(name, artifact_location=artifacts)
        self.run_id = self.client.create_run(experiment, run_name=f"rlkube-{cfg.algorithm}",
                                             tags={"rlkube.algorithm": cfg.algorithm}).info.run_id
        self.failed = False
        self.queue: queue.SimpleQueue[list | None] = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write, name="rlkube-mlflow", daemon=True)
        self.writer.start()
        log.info("mlflow: run %s in %s (mlflow ui --backend-store-uri %s)", self.run_id, uri, uri)

    def config(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        params = [Param(k, v[:MAX_PARAM_VAL_LENGTH]) for k, v in flat_params(config).items()]
        for chunk in _chunks(params, self.BATCH):
            self.client.log_batch(self.run_id, params=chunk)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.queue.put([Metric(k, float(v), now, step) for k, v in values.items()])

    def _write(self) -> None:
        """The writer thread: what the queue holds, in calls of BATCH metrics, until None comes."""
        done = False
        while not done:
            metrics = []
            for item in [self.queue.get(), *_drain(self.queue)]:
                done = done or item is None
                metrics += item or []
            try:
                for chunk in _chunks(metrics, self.BATCH):
                    self.client.log_batch(self.run_id, metrics=chunk)
            except Exception as e:  # a store gone away must not end the training run; said once
                if not self.failed:
                    log.warning("mlflow: metrics not written (%s: %s); training goes on", type(e).__name__, e)
                self.failed = True

    def finish(self, summary: dict[str, Any] | None, step: int) -> None:
        if summary is not None:
            self.scalars(step, {SUMMARY_PREFIX + k: v for k, v in flat_numbers(summary).items()})
        self.queue.put(None)
        self.writer.join()
        if summary is not None:
            self.client.log_dict(self.run_id, summary, "summary.json")
        self.client.set_terminated(self.run_id, "FINISHED" if summary is not None else "FAILED")


class WandbTracker(Tracker):
    NEEDS = (("wandb", "wandb"),)

    def __init__(self, cfg: RuntimeConfig) -> None:
        super().__init__(cfg)
        import wandb

        # Offline unless the user can reach W&B: a pod without a key must not fail or hang on a login.
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.dir.mkdir(parents=True, exist_ok=True)
        # console "off": W&B would otherwise wrap stdout, where rank 0 prints its JSON lines or the
        # progress view; silent: the run's place is said once below, in the runtime's log.
        settings = wandb.Settings(console="off", silent=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "rlkube", dir=str(self.dir), mode=mode,
                              name=f"rlkube-{cfg.algorithm}", settings=settings, reinit="create_new")
        if mode == "offline":
            run_dir = Path(self.run.dir).parent  # the run's folder, above its files/
            log.info("wandb: offline run %s in %s (upload it with: wandb sync %s)", self.run.id, run_dir, run_dir)
        else:
            log.info("wandb: %s run %s at %s", mode, self.run.id, self.run.url)

    def config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def finish(self, summary: dict[str, Any] | None, step: int) -> None:
        if summary is not None:
            self.run.summary.update({SUMMARY_PREFIX + k: v for k, v in summary.items() if v is not None})
        self.run.finish(exit_code=0 if summary is not None else 1)


# training.reportTo's names -> the tracker that writes each.
TRACKERS: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoardTracker,
    "mlflow": MlflowTracker,
    "wandb": WandbTracker,
}


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found without importing it)."""
    return importlib.util.find_spec(module) is not None


def tracker_problems(cfg: RuntimeConfig, env: Mapping[str, str] | None = None) -> list[str]:
    """One line per tracker of training.reportTo whose package this environment lacks."""
    env = os.environ if env is None else env
    found = []
    for name in cfg.training.trackers():
        missing = [package for module, package in TRACKERS[name].needs(env) if not installed(module)]
        if missing:
            found.append(f"{FIELD}: {name} needs {', '.join(missing)}, not installed here: {INSTALL}")
    return found


class Trackers:
    """The run's trackers (none on ranks other than 0, or without training.reportTo), driven as one."""

    def __init__(self, cfg: RuntimeConfig, is_main: bool) -> None:
        self.open: list[Tracker] = []
        self.step = 0
        if not is_main:
            return
        problems = tracker_problems(cfg)
        if problems:
            raise ConfigError("\n".join(problems))
        try:
            for name in cfg.training.trackers():
                self.open.append(TRACKERS[name](cfg))
        except BaseException:
            self.finish(None)
            raise

    def started(self, config: dict[str, Any]) -> None:
        for tracker in self.open:
            tracker.config(config)

    def step_done(self, rec: StepRecord) -> None:
        if self.open:
            self.step = rec.step
            values = step_scalars(rec)
            for tracker in self.open:
                tracker.scalars(rec.step, values)

    def finish(self, summary: dict[str, Any] | None) -> None:
        """Close every tracker (each even when another fails), the summary (summary.status_summary's
        figures and paths) logged when given."""
        trackers, self.open = self.open, []
        for tracker in trackers:
            try:
                tracker.finish(summary, self.step)
            except Exception as e:  # the run's outcome stands; a tracker that cannot close says so
                log.warning("%s: could not finish the run (%s: %s)", type(tracker).__name__, type(e).__name__, e)


def _drain(waiting: queue.SimpleQueue) -> Iterator:
    """What `waiting` holds now, without waiting for more."""
    while True:
        try:
            yield waiting.get_nowait()
        except queue.Empty:
            return


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
