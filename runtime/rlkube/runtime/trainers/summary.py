"""The run's summary, rank 0's last words once the last checkpoint is committed: one
`"event": "summary"` JSON line, or a few lines under the progress view on a terminal.

What it holds (`RunTally.summary`): the steps this run computed, their tokens, the wall time since
the process started and its start-up share, tokens per second per GPU over the training time
(from the start event to the end of the last step, so checkpoint stalls and evaluations count),
the tail (the end of the last step to its checkpoint and export committed), the mean over steps
of the least busy GPU's busy fraction, the peak memory fraction (the largest
any step had) and what it is in GiB of the card, the newest committed checkpoint, the exported
model and adapter, and the two Python lines that load the exported model. The same figures and
paths (`status_summary`) end up in the job's status.summary and in the experiment trackers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rlkube.runtime.contract import progress as report
from rlkube.runtime.infra.startup import process_start_time
from rlkube.runtime.trainers.record import StepRecord

GIB = 1024**3


def load_lines(model_path: str) -> list[str]:
    """The two Python lines that load an exported model directory (infra/export.py writes its
    tokenizer next to it)."""
    return ["from transformers import AutoModelForCausalLM, AutoTokenizer",
            f"model, tokenizer = AutoModelForCausalLM.from_pretrained({model_path!r}), "
            f"AutoTokenizer.from_pretrained({model_path!r})"]


class RunTally:
    """What the summary adds up over a run's steps."""

    def __init__(self, gpus: int, memory_total: int | None, clock: Callable[[], float] = time.time) -> None:
        self.gpus, self.memory_total, self.clock = gpus, memory_total, clock
        self.started_at = clock()
        self.last_step_at: float | None = None
        self.startup_seconds: float | None = None
        self.steps: list[int] = []
        self.tokens = 0
        self.busy: list[float] = []
        self.peak: float | None = None
        self.outputs: dict = {}
        self.tail_seconds: float | None = None  # the last step to its checkpoint and export committed

    def started(self, event: dict) -> None:
        self.started_at = self.clock()
        self.startup_seconds = (event.get(report.STARTUP_SECONDS) or {}).get("total")

    def add(self, rec: StepRecord) -> None:
        self.last_step_at = self.clock()
        self.steps.append(rec.step)
        self.tokens += rec.tokens
        if rec.gpu_utilization is not None:
            self.busy.append(rec.gpu_utilization)
        peak = rec.fields.get("peakMemoryFraction")
        if isinstance(peak, (int, float)):
            self.peak = max(self.peak or 0.0, peak)

    def exported(self, fields: dict | None) -> None:
        """An export's /progress fields (infra/export.py)."""
        self.outputs.update((fields or {}).get(report.OUTPUTS) or {})

    def summary(self, checkpoint: str | None) -> dict:
        """The summary event; `checkpoint` is the newest committed checkpoint's path."""
        training = (self.last_step_at or self.clock()) - self.started_at
        model = (self.outputs.get(report.OUTPUT_MODEL) or {}).get(report.OUTPUT_PATH)
        adapter = (self.outputs.get(report.OUTPUT_ADAPTER) or {}).get(report.OUTPUT_PATH)
        return {
            "event": "summary", "steps": len(self.steps),
            "firstStep": self.steps[0] if self.steps else None, "lastStep": self.steps[-1] if self.steps else None,
            "tokens": self.tokens, "wallSeconds": round(self.clock() - process_start_time(), 2),
            "startupSeconds": self.startup_seconds, "trainingSeconds": round(training, 2),
            "tailSeconds": self.tail_seconds, "gpus": self.gpus,
            "tokensPerSecondPerGpu": self.tokens / training / self.gpus if training > 0 else None,
            "gpuBusyMean": sum(self.busy) / len(self.busy) if self.busy else None,
            "peakMemoryFraction": self.peak,
            "peakMemoryGiB": round(self.peak * self.memory_total / GIB, 2)
            if self.peak is not None and self.memory_total else None,
            "checkpoint": checkpoint, "model": model, "adapter": adapter,
            "load": load_lines(model) if model else None,
        }


def status_summary(s: dict) -> dict:
    """The summary event as a report carries it (contract/progress.py SUMMARY_FIELDS): the figures
    and paths, without the event's name and the Python lines that load the model."""
    return {key: s.get(key) for key in report.SUMMARY_FIELDS}


def summary_lines(s: dict, device: str) -> list[str]:
    """The summary event in a few lines for a person (`device`: "cuda", "cpu", ...)."""
    per = "GPU" if device == "cuda" else "process"
    steps = f"steps {s['firstStep']}-{s['lastStep']}" if s["steps"] else "no steps"
    startup = f" (start-up {s['startupSeconds']:.1f}s)" if s["startupSeconds"] is not None else ""
    rate = f", {s['tokensPerSecondPerGpu']:,.0f} tokens/s per {per}" if s["tokensPerSecondPerGpu"] else ""
    lines = [f"done: {steps}, {s['tokens']:,} tokens in {s['wallSeconds']:.1f}s{startup}{rate}"]
    if device == "cuda":
        busy = f"GPU busy {s['gpuBusyMean']:.2f} on average" if s["gpuBusyMean"] is not None else "GPU busy not measured"
        peak = s["peakMemoryFraction"]
        gib = f" ({s['peakMemoryGiB']:.1f} GiB)" if s["peakMemoryGiB"] is not None else ""
        lines.append(f"{busy}, peak memory {peak:.2f} of the card{gib}" if peak is not None else busy)
    else:
        lines.append(f"on {device}: GPU busy time and GPU memory are not measured")
    if s["checkpoint"]:
        lines.append(f"checkpoint: {s['checkpoint']}")
    if s["adapter"]:
        lines.append(f"LoRA adapter (PEFT): {s['adapter']}")
    if s["model"]:
        lines.append(f"model: {s['model']}")
        lines += [f"  {line}" for line in s["load"]]
    return lines
