"""The lifecycle's entry point: the order in which the policies are asked. Pure.

`decide` fails a job whose spec does not parse, then asks, in this order: `ttl` (a finished job),
`deadline`, `suspend`, `queue` (whether Kueue admitted a queued job), the pods of earlier attempts
(deleted and waited for here; `node_loss` force-deletes those stranded on a lost node), `restart`
(the backoff of the last restart), and hands the gang of this attempt to the phase it is in:
`admission` (no plan, or a plan not admitted yet), then `repair` and `outcome` (admitted).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from rlkube.operator.api.observed import JobView, PodView
from rlkube.operator.lifecycle import (
    admission,
    deadline,
    node_loss,
    outcome,
    queue,
    repair,
    restart,
    suspend,
    ttl,
)
from rlkube.operator.lifecycle.decider import AttemptState, Decider
from rlkube.operator.lifecycle.decision import Decision, Settings
from rlkube.operator.planning.cluster import Cluster
from rlkube.operator.render.status import TERMINAL_PHASES


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
        return ttl.finished(d)

    left = deadline.seconds_left(d)
    if left is not None and left <= 0:
        return deadline.exceeded(d)

    if spec.run_policy.suspend:
        return suspend.suspended(d)
    suspend.note_resumed(d)
    queued = queue.admitted_or_decide(d)
    if queued is not None:
        return queued

    stale = [p for p in d.pods if p.attempt != s.attempt]
    if stale:
        return _older_attempts(d, stale)

    backoff = restart.wait_out(d)
    if backoff is not None:
        return backoff

    decision = _gang(d) if s.placement is not None else admission.plan_and_admit(d)
    return deadline.wake_by_deadline(decision, left)


def _older_attempts(d: Decider, stale: list[PodView]) -> Decision:
    """Pods of an earlier attempt are deleted and waited for: pod names are reused by the next
    attempt, so at most one pod per index ever exists."""
    waiting = [p.name for p in stale if p.terminating]
    delete = [p.name for p in stale if not p.terminating]
    forced = node_loss.stranded(d, [p for p in stale if p.terminating])  # none would ever go
    if forced is not None:
        return forced
    message = f"waiting for {len(stale)} pod(s) of earlier attempts to go"
    return d.finish("Restarting", d.kept_reason("Restarting"), message,
                    action="delete" if delete else "wait", delete=delete,
                    requeue_after=None if waiting and not delete else 2.0)


def _gang(d: Decider) -> Decision:
    """This attempt has a plan: admit it, repair it, or judge what its pods add up to."""
    gang = d.gang()
    if d.s.admission_time is None:
        return admission.admit(d, gang)
    repaired = repair.repair(d, gang)
    if repaired is not None:
        return repaired
    return outcome.judge(d, gang)
