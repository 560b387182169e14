"""Node loss: a node of the gang gone, out of service, or not Ready past its grace. Pure.

A node is lost when it left the cluster, is tainted `node.kubernetes.io/out-of-service` (an
administrator's word that it was shut down without a drain), or has not been Ready for
`Settings.node_lost_grace_seconds` (the kubelet stopped reporting: Unknown, or NotReady). Waiting
for Kubernetes' own taint eviction (300 s by default) and then for the pods on that node to go
would hang the job: a pod on an unreachable node is never confirmed gone. So the gang is re-planned
away from a lost node (Event `NodeLost` naming it; counted against backoffLimit only with
`Settings.node_lost_counts`), and the pods stranded there are deleted with grace 0, as Kubernetes'
non-graceful node shutdown does. The old processes, if they still run behind a partition, cannot
commit a checkpoint for the new attempt: the runtime fences commits by attempt (checkpoint.py).

An elastic job that no longer fits at its size shrinks: the next attempt is planned by the elastic
planning (planning's `largest_plan`) on what is left, and the Event `ElasticShrink` says so
(lifecycle/elastic.py). A node loss that counts (`Settings.node_lost_counts`) is a restart like a
crash, up to backoffLimit (lifecycle/restart.py).

Nodes are only looked at when a pod gives a sign of trouble (bound and not Ready, or being
deleted), since listing them is the expensive part of a reconcile; the node controller marks the
pods of a node that stops reporting not Ready, which brings the job here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import replace

from rlkube.operator.api.observed import PodView, parse_time
from rlkube.operator.lifecycle import elastic, restart
from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import NEED_CLUSTER, Decision
from rlkube.operator.planning.cluster import Cluster

NODE_LOST = "NodeLost"


def lost_nodes(cluster: Cluster, names: Iterable[str], now: dt.datetime,
               grace: float) -> tuple[dict[str, str], float | None]:
    """Of the nodes `names`: node -> why it is lost, and the seconds until the next unhealthy
    node's grace runs out (None when no node is unhealthy within its grace)."""
    lost: dict[str, str] = {}
    next_check: float | None = None
    for name in sorted(set(names)):
        health = cluster.health.get(name)
        if name not in cluster.node_names or health is None:
            lost[name] = f"node {name} is gone"
        elif health.out_of_service:
            lost[name] = f"node {name} is tainted node.kubernetes.io/out-of-service"
        elif health.ready != "True":
            since = parse_time(health.since)
            down = (now - since).total_seconds() if since is not None else grace
            state = "NotReady" if health.ready == "False" else "Unknown"
            if down >= grace:
                lost[name] = f"node {name} has been {state} for {down:.0f}s (grace {grace:g}s)"
            else:
                next_check = min(next_check or grace, grace - down)
    return lost, next_check


def _troubled(pod: PodView) -> bool:
    return bool(pod.node) and (pod.terminating or (not pod.ready and pod.phase in ("Pending", "Running", "Unknown")))


def node_loss(d: Decider, gang: Gang) -> Decision | float | None:
    """The admitted gang's nodes: a teardown away from a lost one; seconds until an unhealthy
    node's grace runs out (look again then); or None when the nodes are fine."""
    mine = [p for p in d.pods if p.attempt == d.s.attempt and p.node]
    if d.cluster is None:
        return NEED_CLUSTER if any(_troubled(p) for p in mine) else None
    lost, next_check = lost_nodes(d.cluster, {p.node for p in mine}, d.now, d.settings.node_lost_grace_seconds)
    if not lost:
        return next_check
    stranded = [p.name for p in mine if p.node in lost]
    why = f"{'; '.join(lost.values())}: force-deleting {', '.join(stranded)}"
    elastic.note_shrink(d, gang, lost)
    replan = f"{why}; re-planning the gang away from it"
    if d.settings.node_lost_counts:
        decision = restart.restart_or_fail(d, NODE_LOST, why, restart_message=replan, event_at_limit=True)
    else:
        decision = d.teardown(NODE_LOST, replan)
    return replace(decision, delete=tuple(n for n in decision.delete if n not in stranded),
                   force_delete=tuple(stranded))


def stranded(d: Decider, leaving: Sequence[PodView]) -> Decision | None:
    """Pods of earlier attempts past their deletion time on a lost node: force-delete them (grace
    0), since no kubelet will ever confirm them gone. None when there are none."""
    overdue = [p for p in leaving if p.node and _overdue(p, d.now)]
    if not overdue:
        return None
    if d.cluster is None:
        return NEED_CLUSTER
    lost, _ = lost_nodes(d.cluster, {p.node for p in overdue}, d.now, d.settings.node_lost_grace_seconds)
    names = [p.name for p in overdue if p.node in lost]
    if not names:
        return None
    d.event("Warning", "ForceDeleted", f"pod(s) {', '.join(names)} stranded on lost node(s) "
            f"{', '.join(sorted(lost))}: deleted with grace 0")
    decision = d.finish("Restarting", d.kept_reason("Restarting"),
                        f"force-deleting {len(names)} pod(s) of earlier attempts stranded on lost nodes",
                        action="force-delete", requeue_after=2.0)
    return replace(decision, force_delete=tuple(names))


def _overdue(pod: PodView, now: dt.datetime) -> bool:
    deadline = parse_time((pod.raw.get("metadata") or {}).get("deletionTimestamp"))
    return pod.terminating and deadline is not None and deadline <= now
