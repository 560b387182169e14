"""What a step and a run report: the typed step record, and the one place it becomes the step's
JSON log line, its /progress fields and its /metrics gauges.

A trainer's `train_step` hands back its step as a dict of log fields (camelCase, as `kubectl logs`,
the operator's docs and the tests read them); `StepRecord.from_fields` takes the fields every
trainer has (step, loss, tokens, seconds, tokensPerSecond, mfu) out of it into typed attributes
and keeps the rest, the trainer's own fields (DPO's accuracy and margin, PPO's value_loss and
timings), in `fields`. The loop then adds what it measured around the step: the GPU busy window
of every rank, the evaluation when one ran, the start-up split on this run's first step.

`log_line()`, `progress_fields()` and `busy_ranks` are all that the reporting reads
(trainers/reporting.py): the /progress names are contract/progress.py's, and what else a
trainer's records show there (/progress rewardMean, extra gauges) is its `StepReport`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlkube.runtime.contract import progress as report
from rlkube.runtime.trainers.evaluation import eval_progress

# The log line's names of the fields every trainer reports (their /progress names where they have one).
SECONDS = "seconds"  # /progress stepSeconds
TOKENS = "tokens"  # /metrics rlkube_tokens (a counter), not a /progress field
EVAL = "eval"


@dataclass(frozen=True)
class StepReport:
    """What a trainer's step records show on /progress and /metrics besides the common fields."""

    reward_mean: str  # the field shown as /progress rewardMean (DPO/KTO: rewardChosen)
    gauges: Mapping[str, str]  # field -> its /metrics gauge rlkube_<name> (only numbers are set)


@dataclass
class StepRecord:
    """One optimizer step as the loop reports it."""

    step: int  # 1-based: optimizer steps done after it
    loss: float | None  # None where no rank trained the actor's loss
    tokens: int  # real (non-pad) tokens of the step, whole job
    seconds: float
    tokens_per_second: float | None
    mfu: float | None
    report: StepReport
    fields: dict[str, Any]  # the trainer's own fields, by their log-line names
    # What the loop adds after the step (Trainer.end_step).
    gpu_utilization: float | None = None  # the least busy rank's mean over the step
    gpu_busy_phases: dict[str, float] | None = None  # each phase's busy mean over ranks
    phase_seconds: dict[str, float] | None = None  # this rank's seconds in each phase
    busy_ranks: list[dict] = field(default_factory=list)  # every rank's busy row (gpu_busy.JobBusy.ranks)
    eval: dict | None = None  # {"step": n, ...} when the run evaluated after this step
    startup_seconds: dict[str, float] | None = None  # this run's first step only
    compile_cache: dict | None = None  # this run's first step only, where torch.compile's cache is kept

    @classmethod
    def from_fields(cls, fields: dict[str, Any], step_report: StepReport) -> StepRecord:
        """The record of a trainer's step fields (an "event": "step" dict)."""
        own = {k: v for k, v in fields.items() if k not in _TYPED}
        return cls(step=fields[report.STEP], loss=fields[report.LOSS], tokens=fields[TOKENS],
                   seconds=fields[SECONDS], tokens_per_second=fields[report.TOKENS_PER_SECOND],
                   mfu=fields[report.MFU], report=step_report, fields=own)

    def __getitem__(self, key: str) -> Any:
        """A field by its log-line name (KeyError where the line has none)."""
        return self.log_line()[key]

    def log_line(self) -> dict[str, Any]:
        """The step's JSON log line (infra/log.emit adds the time)."""
        line = {"event": "step", report.STEP: self.step, report.LOSS: self.loss, TOKENS: self.tokens,
                SECONDS: self.seconds, report.TOKENS_PER_SECOND: self.tokens_per_second, report.MFU: self.mfu,
                **self.fields, report.GPU_UTILIZATION: self.gpu_utilization,
                report.GPU_BUSY_PHASES: self.gpu_busy_phases, report.PHASE_SECONDS: self.phase_seconds}
        optional = {EVAL: self.eval, report.STARTUP_SECONDS: self.startup_seconds,
                    "compileCache": self.compile_cache}
        return {**line, **{k: v for k, v in optional.items() if v is not None}}

    def progress_fields(self) -> dict[str, Any]:
        """What `Progress.update` takes of the step: the /progress fields (each with its /metrics
        gauge), the tokens counted, and the trainer's extra gauges."""
        shown = {report.STEP: self.step, report.LOSS: self.loss, report.MFU: self.mfu,
                 report.TOKENS_PER_SECOND: self.tokens_per_second, report.STEP_SECONDS: self.seconds,
                 report.GPU_UTILIZATION: self.gpu_utilization, report.GPU_BUSY_PHASES: self.gpu_busy_phases,
                 report.PHASE_SECONDS: self.phase_seconds,
                 report.REWARD_MEAN: self.fields.get(self.report.reward_mean)}
        if self.eval is not None:
            shown.update(eval_progress(self.eval))
        if self.startup_seconds is not None:  # the first step of this run completes the split
            shown[report.STARTUP_SECONDS] = self.startup_seconds
        extra = {gauge: self.fields[key] for key, gauge in self.report.gauges.items()
                 if isinstance(self.fields.get(key), (int, float))}
        return {**shown, "tokens": self.tokens, "extra": extra}


_TYPED = frozenset({report.STEP, report.LOSS, TOKENS, SECONDS, report.TOKENS_PER_SECOND, report.MFU})


@dataclass
class TrainResult:
    """What one run of `Trainer.train` computed in this process: its steps, in order."""

    first_step: int  # 1-based number of the first step this run computed
    steps: list[StepRecord] = field(default_factory=list)
    # What the run's adaptive batch sizing decided, in order (DPO/KTO: the adaptive batcher's).
    decisions: list[str] = field(default_factory=list)

    @property
    def steps_run(self) -> int:
        return len(self.steps)

    @property
    def records(self) -> list[dict[str, Any]]:
        """Each step's log line."""
        return [rec.log_line() for rec in self.steps]

    @property
    def losses(self) -> list[float | None]:
        return [rec.loss for rec in self.steps]

    def series(self, key: str) -> list[Any]:
        """One field of every step, by its log-line name (accuracy, rewardMean, value_loss, ...)."""
        return [rec[key] for rec in self.steps]

    @property
    def evals(self) -> list[dict]:
        """The evaluations of this run, in order (trainers/evaluation.py)."""
        return [rec.eval for rec in self.steps if rec.eval is not None]
