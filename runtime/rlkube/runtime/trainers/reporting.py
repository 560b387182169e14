"""What the world sees of a run while it trains: the pod's HTTP endpoint, rank 0's /progress and
/metrics, the step's log line, and the termination message when the run ends.

- The endpoint (infra/progress.py): one server per pod, on the pod's first process (pods have
  their own network namespace; the operator's probes hit it). Rank 0 serves /progress and
  /metrics, the first process of every other pod /healthz only.
- The phases the operator reads from /progress: starting, then training from the start event,
  succeeded after the last step, failed on a non-finite loss (a stop or a crash leaves training:
  the exit code says the rest); the last report is left as the container's termination message
  when the run ends, however it ends.
- Of each step (record.StepRecord, the one conversion): its /progress fields and gauges, and
  `rlkube_gpu_busy_ratio{role,rank,phase}` for every rank; of a checkpoint save, how long it held
  the loop; of an export, the model's path (docs/metrics.md).
- What rank 0 prints (`RunConsole`): JSON lines (the start event, every step's log line, then the
  summary event), or on a terminal the progress view (trainers/progress_view.py) and the
  summary in words (trainers/summary.py); infra/terminal.log_format decides. The experiment
  trackers of training.reportTo (trainers/trackers.py) get the same: the config at the start,
  each step's numbers, the summary.
- The summary of a run that succeeded also joins the last report (/progress `summary`) and is
  left in the termination message again, so the operator copies it into `status.summary`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.infra.checkpoint import latest
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.infra.errors import NonFiniteLoss
from rlkube.runtime.infra.log import emit, log, route_events
from rlkube.runtime.infra.metrics import BusyGauges
from rlkube.runtime.infra.progress import (
    Progress,
    ProgressServer,
    adopt_early_server,
    write_termination_message,
)
from rlkube.runtime.infra.terminal import log_format
from rlkube.runtime.trainers.progress_view import ProgressView
from rlkube.runtime.trainers.record import StepRecord
from rlkube.runtime.trainers.summary import RunTally, status_summary, summary_lines
from rlkube.runtime.trainers.trackers import Trackers, run_config


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


class RunConsole:
    """What rank 0 prints of a run on stdout (other ranks print nothing): in the JSON format a line
    per event; in the text format the progress view, with the other events in words above it; and
    what it hands the experiment trackers. A context manager, entered before the loop's
    checkpointer is: on the way out of a run that succeeded, its last checkpoint is committed, and
    the summary follows (summary.py), to stdout, the trackers and `on_summary`."""

    def __init__(self, cfg: RuntimeConfig, ctx: DistContext, memory_total: int | None = None) -> None:
        self.cfg, self.device = cfg, ctx.device.type
        self.is_main = ctx.is_main
        self.trackers = Trackers(cfg, ctx.is_main)  # first: a tracker's missing package stops the run here
        self.tally = RunTally(ctx.world_size, memory_total) if ctx.is_main else None
        self.text = ctx.is_main and log_format() == "text"
        self.view: ProgressView | None = None
        self.succeeded = False
        self.on_summary: Callable[[dict], None] | None = None  # ProgressReport's: the summary in the last report

    def __enter__(self) -> RunConsole:
        if self.text:
            self.view = ProgressView(self.cfg.training.steps, self.cfg.algorithm)
            route_events(self.view.event)
        return self

    def started(self, event: dict) -> None:
        self._show(event, lambda tally: tally.started(event), lambda view: view.started(event))
        self.trackers.started(run_config(self.cfg))

    def step(self, rec: StepRecord) -> None:
        self._show(rec.log_line(), lambda tally: tally.add(rec), lambda view: view.step(rec))
        self.trackers.step_done(rec)

    def _show(self, line: dict, count, draw) -> None:
        """Count a record in the summary's tally (rank 0), then draw it in the view or print its JSON line."""
        if self.tally is not None:
            count(self.tally)
        if self.view is not None:
            draw(self.view)
        elif self.is_main:
            emit(line)

    def exported(self, fields: dict | None) -> None:
        if self.tally is not None:
            self.tally.exported(fields)

    def tail(self, seconds: float | None) -> None:
        """The run's tail: the last step to its checkpoint and export committed (the summary's tailSeconds)."""
        if self.tally is not None:
            self.tally.tail_seconds = seconds

    def __exit__(self, exc_type, exc, tb) -> None:
        summary = None
        try:
            try:
                if self.view is not None:
                    self.view.close()  # the last step's lines stay; a traceback starts on a line of its own
            finally:
                route_events(None)
            if exc_type is None and self.succeeded and self.tally is not None:
                found = latest(self.cfg.checkpoint.dir)
                summary = self.tally.summary(str(found[1]) if found else None)
                if self.view is None:
                    emit(summary)
                else:
                    sys.stdout.write("\n".join(summary_lines(summary, self.device)) + "\n")
                    sys.stdout.flush()
                if self.on_summary is not None:
                    self.on_summary(summary)
        finally:
            # A run that did not succeed closes its trackers as failed.
            self.trackers.finish(status_summary(summary) if summary is not None else None)


class ProgressReport:
    """The run's reports, from the start event to the termination message. A context manager: on
    the way out (any way out) it writes the termination message and stops the endpoint; a
    NonFiniteLoss on the way marks the phase failed first."""

    def __init__(self, cfg: RuntimeConfig, ctx: DistContext, console: RunConsole) -> None:
        self.console = console
        self.progress = Progress(cfg.training.steps, gpus=ctx.world_size) if ctx.is_main else None
        self.gauges = BusyGauges(self.progress.registry, ctx.role_ranks) if self.progress is not None else None
        self.server = serve_progress(cfg, ctx, self.progress)
        if self.progress is not None:
            console.on_summary = self.summarized

    def __enter__(self) -> ProgressReport:
        return self

    def started(self, event: dict, start_step: int) -> None:
        """The start event (log) and the training phase (/progress) from `start_step` steps done."""
        self.console.started(event)
        if self.progress is not None:
            plan = event.get("memoryPlan") or {}
            self.progress.update(phase=report.PHASE_TRAINING, step=start_step,
                                 startupSeconds=event.get(report.STARTUP_SECONDS),
                                 memoryPlan=plan.get("summary"))

    def step(self, rec: StepRecord) -> None:
        if self.progress is not None:
            self.progress.update(**rec.progress_fields())
            self.gauges.set(rec.busy_ranks)
        self.console.step(rec)

    def checkpointed(self, stall_seconds: float) -> None:
        """A checkpoint save that held the loop for `stall_seconds`."""
        if self.progress is not None:
            self.progress.observe_checkpoint(stall_seconds)

    def exported(self, fields: dict | None) -> None:
        """An export's /progress fields (infra/export.py), where one happened."""
        self.console.exported(fields)
        if self.progress is not None and fields:
            self.progress.update(**fields)

    def succeeded(self) -> None:
        self.console.succeeded = True
        if self.progress is not None:
            self.progress.update(phase=report.PHASE_SUCCEEDED)

    def summarized(self, summary: dict) -> None:
        """The run's summary (rank 0, once its last checkpoint is committed: after `__exit__`) into
        the last report, left again as the termination message."""
        self.progress.update(**{report.SUMMARY: status_summary(summary)})
        write_termination_message(self.progress)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.progress is not None:
                if exc_type is not None and issubclass(exc_type, NonFiniteLoss):
                    self.progress.update(phase=report.PHASE_FAILED)
                write_termination_message(self.progress)
        finally:
            if self.server is not None:
                self.server.stop()
