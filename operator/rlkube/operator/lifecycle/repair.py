"""Repair of an admitted gang that is not whole. Pure.

Admission is recorded before it is acted on, so an operator that stopped half-way leaves an
admitted gang with pods not yet created or gates not yet removed: those steps are finished here,
since the decision to admit was made and written already. Pods not created yet hold no GPUs in
anyone's inventory, though: while the operator was down, another gang may have been planned onto
them. So missing pods are created only while the plan still fits the free GPUs; when it does not,
the gang is re-planned (attempt+1, not counted), as an unadmitted plan that no longer fits is.
Pods that still cannot be created after gangTimeoutSeconds end the attempt (GangTimeout). A pod
that vanished after it started, or a lost node (gone, out-of-service, or not Ready past its
grace: lifecycle/node_loss.py), cannot be repaired in place: the gang is re-planned (attempt+1,
not counted against backoffLimit).
"""

from __future__ import annotations

from dataclasses import replace

from rlkube.operator import render
from rlkube.operator.api.observed import parse_time
from rlkube.operator.lifecycle import node_loss, outcome
from rlkube.operator.lifecycle.admission import replan_unless_fits
from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import Decision, Ungate


def repair(d: Decider, gang: Gang) -> Decision | None:
    """The step that makes the admitted gang whole again, or None when it is whole."""
    lost = node_loss.node_loss(d, gang)
    if isinstance(lost, Decision):
        return lost
    repaired = _repair(d, gang)
    if repaired is None and lost is not None:
        # A node of the gang is unhealthy within its grace: judge the gang as usual, and look
        # again when the grace runs out (nothing else may wake the job then).
        judged = outcome.judge(d, gang)
        if judged.status is not None:
            return replace(judged, requeue_after=min(judged.requeue_after or lost, max(1.0, lost)))
    return repaired


def _repair(d: Decider, gang: Gang) -> Decision | None:
    s, job, spec, placement, current = d.s, d.job, gang.spec, gang.placement, gang.current
    if gang.missing:
        if not any(p.node or p.phase != "Pending" for p in current) and d.old_phase != "Running":
            timed_out = _gang_timed_out(d, gang)
            if timed_out is not None:
                return timed_out
            # The admitting step stopped before all creates went through: finish them, if the
            # GPUs the missing pods were planned on were not given to another gang meanwhile.
            unfit = replan_unless_fits(d, gang, "gang not whole after admission")
            if unfit is not None:
                return unfit
            objects = [render.render_service(job.ref), render.render_configmap(job.ref, spec, placement.device_map)]
            pods = [render.render_pod(job.ref, spec, placement, plan, s.attempt, d.compile_cache()) for plan in gang.missing]
            ungate = [Ungate(o["metadata"]["name"], 0, s.attempt) for o in pods] if gang.gated_by_us else []
            return d.finish("Scheduling", "Admitted", f"creating {len(gang.missing)} missing pods",
                            action="create", create=objects + pods, ungate=ungate)
        names = ", ".join(d.pod_names()[plan.index] for plan in gang.missing)
        return d.teardown("PodLost", f"pod(s) {names} vanished after admission")

    still_gated = gang.gated
    if gang.gated_by_us and still_gated:
        # Admission was recorded, but not every gate came off (the operator stopped between
        # two removals): finish it; the decision to admit was made and written already.
        return d.finish("Scheduling", "Admitted", f"removing {len(still_gated)} remaining gates",
                        action="ungate", ungate=[Ungate(p.name, p.gate_position, s.attempt) for p in still_gated])

    return None


def _gang_timed_out(d: Decider, gang: Gang) -> Decision | None:
    """Pods that could not be created within gangTimeoutSeconds of admission (a create refused
    again and again: a quota, an admission webhook) end the attempt like pods that never bind."""
    admitted = parse_time(d.s.admission_time)
    timeout = gang.spec.placement.gang_timeout_seconds
    if admitted is None or (d.now - admitted).total_seconds() < timeout:
        return None
    names = ", ".join(d.pod_names()[plan.index] for plan in gang.missing)
    return d.teardown("GangTimeout", f"pod(s) {names} not created within gangTimeoutSeconds {timeout}")
