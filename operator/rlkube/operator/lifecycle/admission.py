"""Before admission: where the gang goes, and when it may start binding to nodes. Pure.

No plan for this attempt: plan the largest gang that fits (an elastic job's, within what Kueue
admitted), after older waiting jobs of its priority class (first come, first served,
planning/fifo.py), then create the gang and admit it in one step. A job without
checkpoint.volumeClaim gets only plans on one node unless the hostPath root is shared
(Settings.host_path_shared). Unplaceable: Pending (Unschedulable, naming what the nodes lack:
selector, taint, readiness, capacity), retried later.

A plan whose admission is not recorded yet: create the missing pods, then remove every gate at
once if the plan still fits the free GPUs, else re-plan (not counted). With Volcano or Kueue the
admission is theirs: rlkube sets no gate and hands the pods over as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlkube.operator import render
from rlkube.operator.api.observed import format_time, uses_gang_gate
from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import NEED_CLUSTER, Decision, Ungate
from rlkube.operator.planning import fifo
from rlkube.operator.planning.cluster import Cluster, largest_plan, plan_fits
from rlkube.operator.planning.placement import Unplaceable
from rlkube.operator.render.status import condition


def plan_and_admit(d: Decider) -> Decision:
    """No plan for this attempt: plan the largest gang that fits, create it and admit it."""
    s, job, spec = d.s, d.job, d.job.spec
    if d.cluster is None:
        return NEED_CLUSTER
    # Older waiting jobs of the same priority class are served first (planning/fifo.py).
    layouts = d.cluster.layouts  # the nodes' topology, grouped once for every plan below (inventory.NodeCatalog)
    free, holders = fifo.held_back(d.cluster.inventory, fifo.ahead_of(job, d.cluster.waiting),
                                   lambda older, inventory: largest_plan(older, inventory, layouts=layouts))
    placement = largest_plan(spec, free, d.settings.host_path_shared, most=d.worker_cap(), layouts=layouts)
    if isinstance(placement, Unplaceable):
        reason = _why_unplaceable(placement.reason, d.cluster, holders)
        old = condition(job.status, "Placed") or {}
        if old.get("reason") != "Unschedulable" or old.get("message") != reason:
            d.event("Warning", "Unschedulable", reason)
        return d.finish("Pending", "Unschedulable", reason, action="unschedulable",
                        requeue_after=d.settings.unschedulable_retry_seconds)
    s.placement = placement
    s.next_attempt_time = None
    if not spec.checkpoint.volume_claim:  # a hostPath on each: cleaned on these when the job goes
        s.checkpoint_nodes = tuple(sorted({*s.checkpoint_nodes, *(p.node for p in placement.pods)}))
    if s.start_time is None:
        s.start_time = format_time(d.now)
    messages = list(placement.messages)
    if spec.elastic is not None:
        messages.append(f"elastic: {len(placement.pods)} pods of minWorkers {spec.elastic.min_workers}.."
                        f"maxWorkers {spec.elastic.max_workers}, the most the free GPUs fit"
                        + d.admission_note())
    d.event("Normal", "Placed", f"attempt {s.attempt}: " + "; ".join(messages))
    if placement.fallback:
        d.event("Warning", "PlacementFallback", "; ".join(placement.messages))
    objects = render.render(job.ref, d.sized_spec(), placement, s.attempt, d.compile_cache())
    # The plan was made on a fresh inventory that counts every other job's unbound pods, so the
    # whole gang fits now: admit it in the same step. The pods are still created gated and the
    # gates removed only after every create succeeded, so no pod binds while its gang is
    # incomplete.
    s.admission_time = format_time(d.now)
    ungate = []
    if uses_gang_gate(job.ref, spec):
        ungate = [Ungate(o["metadata"]["name"], 0, s.attempt) for o in objects if o["kind"] == "Pod"]
    d.event("Normal", "Admitted", f"gang of {len(placement.pods)} pods fits: created and ungated together")
    return d.finish("Scheduling", "Admitted", f"creating {len(placement.pods)} pods" + d.admission_note(),
                    action="create", create=objects, ungate=ungate,
                    requeue_after=float(spec.placement.gang_timeout_seconds))


def admit(d: Decider, gang: Gang) -> Decision:
    """A plan not admitted yet: create its missing pods, then admit it if it still fits."""
    s, job, spec, placement = d.s, d.job, gang.spec, gang.placement
    if gang.missing:
        objects = [render.render_service(job.ref), render.render_configmap(job.ref, spec, placement.device_map)]
        objects += [render.render_pod(job.ref, spec, placement, plan, s.attempt, d.compile_cache()) for plan in gang.missing]
        return d.finish("Scheduling", "Placed", f"creating {len(gang.missing)} missing pods",
                        action="create", create=objects)
    gated = gang.gated
    if gang.gated_by_us and gated:
        unfit = replan_unless_fits(d, gang, "gang not admitted")
        if unfit is not None:
            return unfit
        s.admission_time = format_time(d.now)
        d.event("Normal", "Admitted",
                f"all {len(gang.current)} pods exist and the plan fits: scheduling gates removed")
        return d.finish("Scheduling", "Admitted", "gang admitted, waiting for pods to bind",
                        action="ungate",
                        ungate=[Ungate(p.name, p.gate_position, s.attempt) for p in gated],
                        requeue_after=float(spec.placement.gang_timeout_seconds))
    # Nothing of ours gates the pods (Volcano/Kueue admit), or the gates are already off.
    s.admission_time = format_time(d.now)
    return d.finish("Scheduling", "Admitted", "pods handed to the scheduler", action="admit")


def replan_unless_fits(d: Decider, gang: Gang, what: str) -> Decision | None:
    """None when the gang's plan still fits the free GPUs; else the re-plan (attempt+1, not
    counted) that says `what` and why, or NEED_CLUSTER to find out."""
    if d.cluster is None:
        return NEED_CLUSTER
    why = plan_fits(gang.placement, d.cluster, gang.spec.placement.gpus_per_pod)
    return None if why is None else d.teardown("Replan", f"{what}: {why}", event_type="Normal")


def _why_unplaceable(reason: str, cluster: Cluster, holders: Sequence[str] = ()) -> str:
    """The planner's reason, with what the nodes it could not use say about why: the real cause
    is often a nodeSelector no node matches or a taint, not capacity."""
    parts = [reason]
    if holders:
        parts.append(f"GPUs held for older waiting job(s) {', '.join(holders)} (first come, first served)")
    by_why: dict[str, list[str]] = {}
    for node, why in sorted(cluster.excluded.items()):
        by_why.setdefault(why, []).append(node)
    if by_why:
        total = len(cluster.node_names)
        shown = [f"{len(nodes)} {why} ({', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''})"
                 for why, nodes in sorted(by_why.items(), key=lambda kv: -len(kv[1]))]
        lead = "no node can take the pods" if not cluster.inventory else f"of {total} nodes"
        parts.append(f"{lead}: " + "; ".join(shown))
    return "; ".join(parts)
