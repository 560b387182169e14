"""The progress view: rank 0's run on a terminal, two lines redrawn in place after every step.

    step 12/30 [############..................]  40%  loss 0.2431  accuracy 1.00  41,230 tok/s  ETA 0:03
      generate 1.20s  score 0.05s  train 0.80s  GPU busy 0.93  memory 0.71  step 2.05s  elapsed 0:25

The first line: steps done of the run's total, the loss, the preference accuracy (DPO, KTO) or
the mean reward (PPO, GRPO), tokens per second and the time left. The second: an RL step's
phases (generate, score, train) where the trainer has them, the least busy GPU's busy fraction
and the peak memory fraction on a GPU (neither is measured on a CPU, so they are left out), the
step's seconds and the time since training started. The ETA is the wall time per step since this
run's first step (which pays for compilation and warm-up) times the steps left, so checkpoint
stalls and evaluations count.

What the JSON lines say besides steps (a checkpoint committed, the model exported, an
evaluation) becomes a permanent line above the view (`event_line`); the records that only
machines read (checkpointSave, checkpointStaged) are left to the JSON format.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rlkube.runtime.infra.terminal import LiveLines
from rlkube.runtime.trainers.record import StepRecord

BAR_WIDTH = 20
QUIET_EVENTS = frozenset({"checkpointSave", "checkpointStaged"})
# An RL step's phases: (the step record's field, the view's word).
RL_PHASES = (("generationSeconds", "generate"), ("scoringSeconds", "score"), ("trainingSeconds", "train"))


def duration(seconds: float) -> str:
    """0:05, 12:40, 1:02:03."""
    s = max(int(round(seconds)), 0)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def bar(done: int, total: int) -> str:
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * done // max(total, 1):3d}%"


def step_lines(rec: StepRecord, total: int, eta: float | None, elapsed: float) -> list[str]:
    """The view's two lines after step `rec` of `total`."""
    first = [f"step {rec.step}/{total} {bar(rec.step, total)}"]
    if rec.loss is not None:
        first.append(f"loss {rec.loss:.4f}")
    if isinstance(rec.fields.get("accuracy"), (int, float)):
        first.append(f"accuracy {rec.fields['accuracy']:.2f}")
    elif isinstance(rec.fields.get("rewardMean"), (int, float)):
        first.append(f"reward {rec.fields['rewardMean']:.3f}")
    if rec.tokens_per_second is not None:
        first.append(f"{rec.tokens_per_second:,.0f} tok/s")
    if eta is not None:
        first.append(f"ETA {duration(eta)}")
    second = [f"{word} {rec.fields[key]:.2f}s" for key, word in RL_PHASES
              if isinstance(rec.fields.get(key), (int, float))]
    if rec.gpu_utilization is not None:
        second.append(f"GPU busy {rec.gpu_utilization:.2f}")
    peak = rec.fields.get("peakMemoryFraction")
    if isinstance(peak, (int, float)):
        second.append(f"memory {peak:.2f}")
    second += [f"step {rec.seconds:.2f}s", f"elapsed {duration(elapsed)}"]
    return ["  ".join(first), "  " + "  ".join(second)]


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def event_line(record: dict) -> str | None:
    """A JSON-line record said in words, or None for one the view leaves out."""
    kind = record.get("event")
    if kind in QUIET_EVENTS:
        return None
    if kind == "checkpoint":
        return f"checkpoint after step {record.get('step')}: {record.get('path')}"
    if kind == "export":
        return f"model exported after step {record.get('step')}: {record.get('path')}"
    rest = ", ".join(f"{k} {_value(v)}" for k, v in record.items() if k not in ("event", "time"))
    return f"{kind}: {rest}"


def start_line(event: dict, algorithm: str) -> str:
    """What the view says when training starts: what runs, where, and how long start-up took."""
    total, start = event.get("totalSteps"), event.get("startStep") or 0
    where = f"{event.get('worldSize', 1)} process{'es' if event.get('worldSize', 1) != 1 else ''}"
    resumed = f", resumed after step {start}" if start else ""
    took = (event.get("startupSeconds") or {}).get("total")
    started = f"; started in {took:.1f}s" if took is not None else ""
    return f"{algorithm}: {total} steps on {where}{resumed}{started}"


class ProgressView:
    """Rank 0's view of a run on a terminal (trainers/reporting.RunConsole starts and ends it)."""

    def __init__(self, total: int, algorithm: str, live: LiveLines | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.algorithm, self.clock = total, algorithm, clock
        self.live = live if live is not None else LiveLines()
        self.started_at = clock()
        self.first: tuple[int, float] | None = None  # (step, when) of this run's first step

    def started(self, event: dict) -> None:
        self.started_at = self.clock()
        start = event.get("startStep") or 0
        self.live.note(start_line(event, self.algorithm))
        self.live.show([f"step {start}/{self.total} {bar(start, self.total)}  waiting for the first step"])

    def step(self, rec: StepRecord) -> None:
        now = self.clock()
        if self.first is None:
            self.first = (rec.step, now)
        first_step, first_at = self.first
        left = self.total - rec.step
        per_step = (now - first_at) / (rec.step - first_step) if rec.step > first_step else rec.seconds
        if rec.eval is not None:
            self.live.note(f"eval after step {rec.step}: " + ", ".join(
                f"{k} {_value(v)}" for k, v in rec.eval.items() if k != "step"))
        self.live.show(step_lines(rec, self.total, per_step * left, now - self.started_at))

    def event(self, record: dict) -> None:
        """A record `emit` would have written as a JSON line (infra/log.route_events)."""
        line = event_line(record)
        if line is not None:
            self.live.note(line)

    def close(self) -> None:
        self.live.close()
