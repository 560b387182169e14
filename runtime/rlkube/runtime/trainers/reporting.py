"""What the world sees of a run while it trains: the pod's HTTP endpoint, rank 0's /progress and
/metrics, the step's log line, and the termination message when the run ends.

- The endpoint (infra/progress.py): one server per pod, on the pod's first process (pods have
  their own network namespace; the operator's probes hit it). Rank 0 serves /progress and
  /metrics, the first process of every other pod /healthz only.
- The phases the operator reads from /progress: starting, then training from the start event,
  succeeded after the last step, failed on a non-finite loss (a stop or a crash leaves training:
  the exit code says the rest); the last report is left as the container's termination message
  when the run ends, however it ends.
- Of each step (record.StepRecord, the one conversion): its log line on rank 0 (a JSON line, or
  the trainer's own printer on a terminal), its /progress fields and gauges, and
  `rlkube_gpu_busy_ratio{role,rank,phase}` for every rank; of a checkpoint save, how long it held
  the loop; of an export, the model's path (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Callable

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import NonFiniteLoss
from rlkube.runtime.infra.log import emit, log
from rlkube.runtime.infra.metrics import BusyGauges
from rlkube.runtime.infra.progress import (
    Progress,
    ProgressServer,
    adopt_early_server,
    write_termination_message,
)
from rlkube.runtime.trainers.record import StepRecord

# How rank 0 prints a step instead of its JSON line: (steps done, the step's log line).
StepPrinter = Callable[[int, dict], None]


def serve_progress(cfg: RuntimeConfig, ctx: DistContext, progress: Progress | None) -> ProgressServer | None:
    """The pod's HTTP endpoint, on its first process only (None elsewhere, or when it cannot listen)."""
    if not cfg.progress_port or ctx.local_rank != 0:
        return None
    early = adopt_early_server()
    if early is not None:
        early.attach(progress)
        return early
    try:
        return ProgressServer(progress, cfg.progress_port)
    except OSError as e:
        log.warning("progress server: cannot listen on port %d (%s); not serving", cfg.progress_port, e)
        return None


class ProgressReport:
    """The run's reports, from the start event to the termination message. A context manager: on
    the way out (any way out) it writes the termination message and stops the endpoint; a
    NonFiniteLoss on the way marks the phase failed first."""

    def __init__(self, cfg: RuntimeConfig, ctx: DistContext, printer: StepPrinter | None = None) -> None:
        self.is_main, self.printer = ctx.is_main, printer
        self.progress = Progress(cfg.training.steps, gpus=ctx.world_size) if ctx.is_main else None
        self.gauges = BusyGauges(self.progress.registry, ctx.role_ranks) if self.progress is not None else None
        self.server = serve_progress(cfg, ctx, self.progress)

    def __enter__(self) -> ProgressReport:
        return self

    def started(self, event: dict, start_step: int) -> None:
        """The start event (log) and the training phase (/progress) from `start_step` steps done."""
        if self.is_main:
            emit(event)
        if self.progress is not None:
            plan = event.get("memoryPlan") or {}
            self.progress.update(phase=report.PHASE_TRAINING, step=start_step,
                                 startupSeconds=event.get(report.STARTUP_SECONDS),
                                 memoryPlan=plan.get("summary"))

    def step(self, rec: StepRecord) -> None:
        if self.progress is not None:
            self.progress.update(**rec.progress_fields())
            self.gauges.set(rec.busy_ranks)
        if self.is_main:
            self.printer(rec.step, rec.log_line()) if self.printer is not None else emit(rec.log_line())

    def checkpointed(self, stall_seconds: float) -> None:
        """A checkpoint save that held the loop for `stall_seconds`."""
        if self.progress is not None:
            self.progress.observe_checkpoint(stall_seconds)

    def exported(self, fields: dict | None) -> None:
        """An export's /progress fields (infra/export.py), where one happened."""
        if self.progress is not None and fields:
            self.progress.update(**fields)

    def succeeded(self) -> None:
        if self.progress is not None:
            self.progress.update(phase=report.PHASE_SUCCEEDED)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.progress is not None:
                if exc_type is not None and issubclass(exc_type, NonFiniteLoss):
                    self.progress.update(phase=report.PHASE_FAILED)
                write_termination_message(self.progress)
        finally:
            if self.server is not None:
                self.server.stop()
