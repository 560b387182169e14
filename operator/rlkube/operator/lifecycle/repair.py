"""Repair of an admitted gang that is not whole. Pure.

Admission is recorded before it is acted on, so an operator that stopped half-way leaves an
admitted gang with pods not yet created or gates not yet removed: those steps are finished here,
since the decision to admit was made and written already. A pod that vanished after it started,
or a node that left the cluster, cannot be repaired in place: the gang is re-planned (attempt+1,
not counted against backoffLimit).
"""

from __future__ import annotations

from rlkube.operator import render
from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import Decision, Ungate


def repair(d: Decider, gang: Gang) -> Decision | None:
    """The step that makes the admitted gang whole again, or None when it is whole."""
    s, job, spec, placement, current = d.s, d.job, gang.spec, gang.placement, gang.current
    if gang.missing:
        if not any(p.node or p.phase != "Pending" for p in current) and d.old_phase != "Running":
            # The admitting step stopped before all creates went through: finish them.
            objects = [render.render_service(job.ref), render.render_configmap(job.ref, spec, placement.device_map)]
            pods = [render.render_pod(job.ref, spec, placement, plan, s.attempt) for plan in gang.missing]
            ungate = [Ungate(o["metadata"]["name"], 0, s.attempt) for o in pods] if gang.gated_by_us else []
            return d.finish("Scheduling", "Admitted", f"creating {len(gang.missing)} missing pods",
                            action="create", create=objects + pods, ungate=ungate)
        names = ", ".join(d.pod_names()[plan.index] for plan in gang.missing)
        return d.teardown("PodLost", f"pod(s) {names} vanished after admission", counted=False)

    still_gated = gang.gated
    if gang.gated_by_us and still_gated:
        # Admission was recorded, but not every gate came off (the operator stopped between
        # two removals): finish it; the decision to admit was made and written already.
        return d.finish("Scheduling", "Admitted", f"removing {len(still_gated)} remaining gates",
                        action="ungate", ungate=[Ungate(p.name, p.gate_position, s.attempt) for p in still_gated])

    if d.cluster is not None:
        lost = [p for p in current if p.node and p.node not in d.cluster.node_names]
        if lost:
            return d.teardown("NodeLost", "node(s) " + ", ".join(sorted({p.node for p in lost})) + " are gone",
                              counted=False)
    return None
