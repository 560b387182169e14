"""The deadline: `runPolicy.activeDeadlineSeconds`, counted from `status.startTime`. Pure.

Like a Job's, the deadline counts from the first plan of the job (a suspended job's from its
resume: lifecycle/suspend.py clears startTime). Past it, the job fails (DeadlineExceeded) and its
pods are deleted. Before it, a decision that would wait for the next event is told to look again
when the deadline falls, since nothing else may wake the job then.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from rlkube.operator.api.observed import parse_time
from rlkube.operator.lifecycle.decider import Decider
from rlkube.operator.lifecycle.decision import Decision

DEADLINE_EXCEEDED = "DeadlineExceeded"


def seconds_left(d: Decider) -> float | None:
    """Seconds until the job's deadline (<= 0: passed); None when it has none or has not started."""
    deadline = d.job.spec.run_policy.active_deadline_seconds
    started = parse_time(d.s.start_time)
    if not deadline or started is None:
        return None
    return (started + dt.timedelta(seconds=deadline) - d.now).total_seconds()


def exceeded(d: Decider) -> Decision:
    """The deadline passed: the job fails."""
    deadline = d.job.spec.run_policy.active_deadline_seconds
    return d.fail(DEADLINE_EXCEEDED, f"activeDeadlineSeconds {deadline} passed since {d.s.start_time}")


def wake_by_deadline(decision: Decision, left: float | None) -> Decision:
    """`decision`, told to look again when the deadline falls if it would otherwise only wait for
    the next event."""
    if left is None or decision.requeue_after is not None or decision.status is None:
        return decision
    return replace(decision, requeue_after=max(1.0, left))
