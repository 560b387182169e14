"""A finished job, and `runPolicy.ttlSecondsAfterFinished`. Pure.

Succeeded and Failed are final: pods still running are deleted (the failed ones stay for their
logs), and a queued job's Kueue Workload is marked Finished, which gives its quota back to the
queue. With ttlSecondsAfterFinished the job itself is deleted that long after its completionTime
(Event TTLExpired); its children go with it by ownerReference garbage collection.
"""

from __future__ import annotations

import datetime as dt

from rlkube.operator.api.observed import parse_time
from rlkube.operator.lifecycle.decider import Decider
from rlkube.operator.lifecycle.decision import Decision
from rlkube.operator.render import kueue_workload as kw
from rlkube.operator.render.status import condition


def finished(d: Decider) -> Decision:
    """The decision for a job whose phase is Succeeded or Failed."""
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
