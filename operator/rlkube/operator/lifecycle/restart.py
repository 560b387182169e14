"""Restart with backoff: a failure that counts against `runPolicy.backoffLimit`. Pure.

A trainer that crashed (an exit code not in failOnExitCodes, lifecycle/outcome.py), and a lost
node when the operator runs with `Settings.node_lost_counts` (lifecycle/node_loss.py), end the
attempt and count: once `backoffLimit` restarts have been made the job fails
(BackoffLimitExceeded), else the whole gang restarts with attempt+1 and restarts+1 after an
exponential backoff (`backoff_seconds`: base, 2x base, 4x base ... capped), recorded in
`status.nextAttemptTime` in the same status write that says why. Until that time the job waits,
phase Restarting (`wait_out`). Every other teardown (a disruption, a re-plan, an elastic resize)
is `Decider.teardown` and counts nothing.
"""

from __future__ import annotations

import datetime as dt

from rlkube.operator.api.observed import format_time, parse_time
from rlkube.operator.lifecycle.decider import Decider
from rlkube.operator.lifecycle.decision import Decision, Settings

BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"


def backoff_seconds(restarts: int, settings: Settings) -> float:
    """Wait before restart number `restarts` (1-based): base, 2x base, 4x base ... capped."""
    return min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** max(0, restarts - 1))


def restart_or_fail(d: Decider, reason: str, message: str, *, restart_message: str | None = None,
                    event_at_limit: bool = False) -> Decision:
    """backoffLimit reached: fail the job (BackoffLimitExceeded); else restart the gang, counted.

    `message` says what ended the attempt; a restart says `restart_message` instead when given.
    `event_at_limit`: post the Warning Event `reason` with `message` before failing, so the
    cause is an Event of its own too (the failure's Event names only the limit)."""
    limit = d.job.spec.run_policy.backoff_limit
    if d.s.restarts >= limit:
        if event_at_limit:
            d.event("Warning", reason, message)
        return d.fail(BACKOFF_LIMIT_EXCEEDED, f"{message}; backoffLimit {limit} reached")
    s = d.s
    s.restarts += 1
    wait = backoff_seconds(s.restarts, d.settings)
    s.next_attempt_time = format_time(d.now + dt.timedelta(seconds=wait))
    text = restart_message if restart_message is not None else message
    return d.teardown(reason, f"{text}; restart {s.restarts}/{limit} in {wait:g}s", action="restart")


def wait_out(d: Decider) -> Decision | None:
    """The backoff of the last restart is not over: wait (phase Restarting) until
    `status.nextAttemptTime`; None when there is no backoff to wait for."""
    next_at = parse_time(d.s.next_attempt_time)
    if next_at is None or next_at <= d.now:
        return None
    wait = (next_at - d.now).total_seconds()
    return d.finish("Restarting", d.kept_reason("Backoff"), f"next attempt at {d.s.next_attempt_time}",
                    requeue_after=wait)
