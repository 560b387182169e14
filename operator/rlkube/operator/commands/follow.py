"""What `rlkube submit --follow` prints and how it ends, as pure functions of the job it reads.

`Follower.observe(job)` takes the job as the API server returns it (a dict, or None once it is
gone) and answers the lines to print (phase changes with their reason, one progress line per new
step from `status.progress`) and, once the job has ended, the exit code: 0 Succeeded, 1 Failed
(the Failed condition's reason and message printed) or deleted. A Suspended job has not ended:
following goes on until it resumes or the timeout. Nothing here talks to the cluster;
`submit.follow_job` does, and tests feed statuses in directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1      # the job ended Failed, or was deleted while followed, or the API refused a request
EXIT_INVALID = 3     # the manifest was refused before anything was sent (as the runtime's exit 3)
EXIT_TIMEOUT = 124   # --timeout passed first (as timeout(1) exits); the job keeps running
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); the job keeps running

# The condition that explains each phase: its reason and message are printed with the phase.
PHASE_CONDITION = {
    "Pending": "Progressing", "Scheduling": "Progressing", "Running": "Progressing",
    "Restarting": "Progressing", "Succeeded": "Succeeded", "Failed": "Failed", "Suspended": "Suspended",
}


def exit_code(phase: str | None) -> int | None:
    """The exit code of a job in `phase`, None while it has not ended."""
    return {"Succeeded": EXIT_SUCCEEDED, "Failed": EXIT_FAILED}.get(phase or "")


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def explain(status: dict, phase: str) -> str:
    """'Reason: message' of the condition behind `phase` ('' when it has none)."""
    found = condition(status, PHASE_CONDITION.get(phase, ""))
    reason, message = found.get("reason") or "", found.get("message") or ""
    return ": ".join(part for part in (reason, message) if part)


def format_duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m: what an ETA needs, no more."""
    whole = max(0, int(round(seconds)))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_line(progress: dict | None) -> str | None:
    """'step 12/30 (40.0%)  ETA 1m05s  1,234 tokens/s  loss 0.6931' from status.progress; None
    before the first step is reported."""
    if not progress or progress.get("step") is None:
        return None
    step, total = progress["step"], progress.get("totalSteps")
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if progress.get("percent") is not None:
        parts[0] += f" ({progress['percent']:.1f}%)"
    if progress.get("etaSeconds") is not None and (not total or step < total):
        parts.append(f"ETA {format_duration(progress['etaSeconds'])}")
    if progress.get("tokensPerSecond") is not None:
        parts.append(f"{progress['tokensPerSecond']:,.0f} tokens/s")
    for key, label in (("loss", "loss"), ("rewardMean", "reward"), ("evalAccuracy", "eval accuracy")):
        if progress.get(key) is not None:
            parts.append(f"{label} {progress[key]:.4g}")
    return "  ".join(parts)


def outputs_line(status: dict) -> str | None:
    """Where the run left its model (status.outputs), for the last line of a Succeeded job."""
    outputs = status.get("outputs") or {}
    found = [f"{kind} {out['path']} (step {out.get('step')})" for kind, out in outputs.items()
             if isinstance(out, dict) and out.get("path")]
    return "exported " + ", ".join(found) if found else None


@dataclass
class Follower:
    """The state of following one job: what was printed last, so that only changes are."""

    name: str
    phase: str | None = None
    step: Any = None
    ended: int | None = None
    seen: bool = field(default=False)

    def observe(self, job: dict | None) -> tuple[list[str], int | None]:
        """(lines to print, exit code once the job has ended, else None) for the job as read now."""
        if job is None:
            if not self.seen:
                return [], None  # not visible yet (just created): read again
            self.ended = EXIT_FAILED
            return [f"job {self.name} was deleted"], self.ended
        self.seen = True
        status = job.get("status") or {}
        lines = []
        phase = status.get("phase")
        self.ended = exit_code(phase)
        if phase and phase != self.phase and self.ended is None:  # an end gets its own line below
            why = explain(status, phase)
            lines.append(f"phase {phase}" + (f" ({why})" if why else ""))
            if phase == "Suspended":
                lines.append("the job is suspended: following until it resumes (spec.suspend: false) or --timeout")
        self.phase = phase or self.phase
        progress = status.get("progress") or {}
        if progress.get("step") is not None and progress.get("step") != self.step:
            self.step = progress["step"]
            lines.append(progress_line(progress) or "")
        if self.ended == EXIT_FAILED:
            lines.append(f"job {self.name} failed: {explain(status, 'Failed') or 'no reason given'}")
        elif self.ended == EXIT_SUCCEEDED:
            exported = outputs_line(status)
            lines.append(f"job {self.name} succeeded" + (f"; {exported}" if exported else ""))
        return lines, self.ended
