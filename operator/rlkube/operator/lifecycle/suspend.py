"""Suspend and resume: `runPolicy.suspend`. Pure.

Setting suspend tears the gang down (attempt+1 when there was a gang or a plan, not counted
against backoffLimit) and the job stays Suspended with no pods; its checkpoint stays. startTime is
cleared, so activeDeadlineSeconds counts from the resume, as for a Job. Clearing suspend resumes
the job: Event Resumed, and the next attempt is planned anew (lifecycle/admission.py).
"""

from __future__ import annotations

from rlkube.operator.lifecycle.decider import Decider
from rlkube.operator.lifecycle.decision import Decision


def suspended(d: Decider) -> Decision:
    """runPolicy.suspend is set: the gang is torn down and stays down."""
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


def note_resumed(d: Decider) -> None:
    """suspend was cleared since the last decision: say so (the gang is planned anew)."""
    if d.old_phase == "Suspended":
        d.event("Normal", "Resumed", "runPolicy.suspend cleared: re-planning the gang")
