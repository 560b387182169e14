"""The lifecycle's entry point and the rules about the job as a whole. Pure.

`decide` checks rules 1-5 of the package docstring here (invalid spec, finished, deadline,
suspend, pods of earlier attempts and the restart backoff), asks `queue` whether Kueue admitted a
queued job, and hands the gang of this attempt to the phase it is in: `admission` (no plan, or a plan not admitted yet), then `repair` and
`outcome` (admitted).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlkube.operator import kueue_workload as kw
from rlkube.operator.api.observed import JobView, PodView, parse_time
from rlkube.operator.lifecycle import admission, nodes, outcome, queue, repair
from rlkube.operator.lifecycle.decider import AttemptState, Decider
from rlkube.operator.lifecycle.decision import Decision, Settings
from rlkube.operator.planning.cluster import Cluster
from rlkube.operator.status import TERMINAL_PHASES, condition


def decide(
    job: JobView,
    pods: Sequence[PodView],
    now: dt.datetime,
    cluster: Cluster | None = None,
    progress: Mapping[str, Any] | None = None,
    settings: Settings = Settings(),
    workload: Mapping[str, Any] | None = None,
    priority: int | None = None,
) -> Decision:
    """What to do next for `job`, whose owned pods are `pods` (see the package docstring).

    `workload` is the job's Kueue Workload when it has one, `priority` the value of its
    priorityClassName (a new Workload carries it); both matter only for a queued job."""
    state = AttemptState.from_status(job.status)
    return _decide(Decider(job, list(pods), now, cluster, progress, settings, state, workload, priority))


def _decide(d: Decider) -> Decision:
    job, s = d.job, d.s
    spec = job.spec
    if spec is None:
        message = job.spec_error or "spec: invalid"
        if d.old_phase != "Failed":
            return d.fail("InvalidSpec", message)
        return d.finish("Failed", "InvalidSpec", message, delete=[p.name for p in d.active()])

    if d.old_phase in TERMINAL_PHASES:
        return _finished(d)

    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(s.start_time)
    if deadline and started is not None:
        left = (started + dt.timedelta(seconds=deadline) - d.now).total_seconds()
        if left <= 0:
            return d.fail("DeadlineExceeded", f"activeDeadlineSeconds {deadline} passed since {s.start_time}")
    else:
        left = None

    if spec.run_policy.suspend:
        return _suspended(d)
    if d.old_phase == "Suspended":
        d.event("Normal", "Resumed", "runPolicy.suspend cleared: re-planning the gang")
    queued = queue.admitted_or_decide(d)
    if queued is not None:
        return queued

    stale = [p for p in d.pods if p.attempt != s.attempt]
    if stale:
        waiting = [p.name for p in stale if p.terminating]
        delete = [p.name for p in stale if not p.terminating]
        forced = nodes.stranded(d, [p for p in stale if p.terminating])  # none would ever go
        if forced is not None:
            return forced
        message = f"waiting for {len(stale)} pod(s) of earlier attempts to go"
        return d.finish("Restarting", d.kept_reason("Restarting"), message,
                        action="delete" if delete else "wait", delete=delete,
                        requeue_after=None if waiting and not delete else 2.0)

    next_at = parse_time(s.next_attempt_time)
    if next_at is not None and next_at > d.now:
        wait = (next_at - d.now).total_seconds()
        return d.finish("Restarting", d.kept_reason("Backoff"), f"next attempt at {s.next_attempt_time}",
                        requeue_after=wait)

    decision = _gang(d) if s.placement is not None else admission.plan_and_admit(d)
    if left is not None and decision.requeue_after is None and decision.status is not None:
        decision = replace(decision, requeue_after=max(1.0, left))
    return decision


def _gang(d: Decider) -> Decision:
    """This attempt has a plan: admit it, repair it, or judge what its pods add up to."""
    gang = d.gang()
    if d.s.admission_time is None:
        return admission.admit(d, gang)
    repaired = repair.repair(d, gang)
    if repaired is not None:
        return repaired
    return outcome.judge(d, gang)


def _finished(d: Decider) -> Decision:
    """Succeeded/Failed are final: remaining pods go; after ttlSecondsAfterFinished, the job too.
    A queued job's Workload is marked Finished, which gives its quota back to the queue."""
    s, spec = d.s, d.job.spec
    cond = condition(d.job.status, s.phase) or {}
    reason, message = str(cond.get("reason") or s.phase), str(cond.get("message") or "")
    if d.workload is not None and not kw.observe_workload(d.workload).finished:
        return d.finish(s.phase, reason, message, action="release", delete=[p.name for p in d.active()],
                        workload_status=kw.finish_patch(d.workload, s.phase == "Succeeded", message or reason,
                                                        d.now))
    ttl = spec.run_policy.ttl_seconds_after_finished
    done = parse_time(s.completion_time)
    if ttl is not None and done is not None:
        left = (done + dt.timedelta(seconds=ttl) - d.now).total_seconds()
        if left <= 0:
            d.event("Normal", "TTLExpired", f"ttlSecondsAfterFinished {ttl} passed: deleting the job")
            return d.finish(s.phase, reason, message, action="delete-job", delete_job=True)
        return d.finish(s.phase, reason, message, delete=[p.name for p in d.active()],
                        requeue_after=max(1.0, left))
    return d.finish(s.phase, reason, message, delete=[p.name for p in d.active()])


def _suspended(d: Decider) -> Decision:
    """runPolicy.suspend: the gang is torn down (attempt+1 when there was one) and stays down."""
    s = d.s
    if d.old_phase != "Suspended":
        if d.pods or s.placement is not None:
            s.attempt += 1
        s.placement = None
        s.admission_time = None
        s.next_attempt_time = None
        s.start_time = None  # activeDeadlineSeconds counts from the resume, as for a Job
        d.event("Normal", "Suspended", "runPolicy.suspend is set: the gang's pods are stopped")
    delete = d.deletable()
    return d.finish("Suspended", "Suspended", "runPolicy.suspend is set",
                    action="suspend" if delete or d.old_phase != "Suspended" else "wait", delete=delete)
