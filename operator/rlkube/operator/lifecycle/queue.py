"""Kueue admission of a job labelled `kueue.x-k8s.io/queue-name` (docs/kueue.md). Pure.

Checked after suspend and before anything of an attempt: a queued job gets a Workload (the gang
as one pod set, `kueue_workload.render_workload`) and waits, phase Pending with reason
QueuedInKueue and Kueue's own word on why, until Kueue admits the Workload; then the attempt
rules run as for any job. An eviction (preemption, a stopped queue) suspends the job: the attempt
ends (attempt+1, not counted), its pods are deleted, the checkpoint stays, and once no pod is
left the quota is handed back (`release_patch`) so the Workload queues again; re-admitted, the
job plans anew and resumes from its checkpoint. A job without the label never gets here.

An elastic job's Workload asks for maxWorkers pods and accepts minWorkers (`minCount`, Kueue's
partial admission); every plan and every ElasticGrow of the job stays within the admitted count
(`Decider.worker_cap`), and a gang larger than what Kueue admits now is re-planned within it.
"""

from __future__ import annotations

from rlkube.operator.lifecycle.decider import Decider
from rlkube.operator.lifecycle.decision import Decision
from rlkube.operator.render import kueue_workload as kw

QUEUED = "QueuedInKueue"
EVICTED = "EvictedByKueue"
# Kueue's decisions reach the operator by polling the Workload (no watch: the operator runs on
# clusters without Kueue, where the Workload kind does not exist).
POLL_SECONDS = 5.0


def admitted_or_decide(d: Decider) -> Decision | None:
    """None when the job may run (not queued, or its Workload is admitted); else what to do."""
    job, spec = d.job, d.job.spec
    queue = kw.queue_of(job.ref)
    if queue is None:
        return None
    if d.workload is None:
        message = f"waiting for Kueue admission in queue {queue}"
        d.event("Normal", "Queued", f"Workload {kw.workload_name(job.name)} created in Kueue queue {queue}")
        return d.finish("Pending", QUEUED, message, action="queue", requeue_after=POLL_SECONDS,
                        workload=kw.render_workload(job.ref, spec, queue, d.priority))
    state = kw.observe_workload(d.workload)
    if state.admitted and not state.evicted:
        # Re-admitted straight after an eviction's release, the job never showed QueuedInKueue.
        if d.old_phase == "Pending" and _reason(d) in (QUEUED, EVICTED):
            d.event("Normal", "AdmittedByKueue", f"{state.admission_message()} (Workload {state.name}, "
                    f"ClusterQueue {state.cluster_queue})")
        return _over_admission(d, state)
    if state.evicted or d.pods or d.s.placement is not None:
        return _evicted(d, state)
    if d.old_phase != "Pending" or _reason(d) != QUEUED:
        d.event("Normal", "Queued", state.waiting_message())
    return d.finish("Pending", QUEUED, state.waiting_message(), requeue_after=POLL_SECONDS)


def _over_admission(d: Decider, state: kw.WorkloadState) -> Decision | None:
    """A plan larger than what Kueue admits now (the admission changed under a running gang):
    end the attempt, not counted; the next one is planned within the admitted count."""
    planned = len(d.s.placement.pods) if d.s.placement is not None else 0
    if state.worker_cap is None or planned <= state.worker_cap:
        return None
    return d.teardown("KueueAdmissionChanged", f"the gang has {planned} pods, Kueue now admits "
                      f"{state.worker_cap} ({state.admission_message()}): re-planning within the admission",
                      event_type="Normal")


def _reason(d: Decider) -> str:
    cond = next((c for c in d.job.status.get("conditions") or [] if c.get("type") == "Progressing"), {})
    return str(cond.get("reason") or "")


def _evicted(d: Decider, state: kw.WorkloadState) -> Decision:
    """Kueue took the admission back (or never gave it to what runs): stop the gang, keep the
    checkpoint, then release the quota so the Workload queues again."""
    s = d.s
    why = f"{state.reason}: {state.message}" if state.evicted else "the Workload is not admitted"
    message = f"Kueue evicted the job ({why}); pods stopped, checkpoint kept, queued again in {state.queue}"
    if s.placement is not None or s.admission_time is not None:
        s.attempt += 1
        s.placement = None
        s.admission_time = None
        s.next_attempt_time = None
        d.event("Warning", "Evicted", message)
    delete = d.deletable()
    if d.pods:
        return d.finish("Pending", EVICTED, message, action="suspend" if delete else "wait", delete=delete,
                        requeue_after=2.0)
    if state.evicted:
        return d.finish("Pending", EVICTED, message, action="release", requeue_after=POLL_SECONDS,
                        workload_status=kw.release_patch(d.workload or {}, d.now))
    return d.finish("Pending", QUEUED, state.waiting_message(), requeue_after=POLL_SECONDS)
