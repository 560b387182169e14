"""What planning sees of the cluster, and the two questions the lifecycle asks of it. Pure.

`cluster_view` turns listed nodes and pods into the job's `Cluster` (the nodes it may use, with
the GPUs other workloads hold or are about to hold); `largest_plan` plans the biggest gang the
spec allows on it; `plan_fits` says whether a plan made earlier still fits it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkube.operator.planning.inventory import (
    InventorySnapshot,
    Layout,
    NodeCatalog,
    NodeHealth,
    NodeInventory,
    WaitingJob,
    pod_use,
    snapshot_from_objects,
    waiting_jobs,
)
from rlkube.operator.planning.placement import Placement, Unplaceable, plan_placement, request_from_spec

# The topology of a cluster view's nodes at some topology keys (inventory.NodeFit.layout).
Layouts = Callable[[Sequence[str]], Layout]


@dataclass(frozen=True)
class Cluster:
    """What planning sees of the cluster: the job's usable nodes, and the names of all nodes."""

    inventory: list[NodeInventory]
    node_names: frozenset[str]
    own_gpus: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs the job's own bound pods hold
    health: Mapping[str, NodeHealth] = field(default_factory=dict)  # every node's, by name
    excluded: Mapping[str, str] = field(default_factory=dict)  # node -> why the job's pods cannot use it
    waiting: tuple[WaitingJob, ...] = ()  # gangs waiting to be planned, oldest first (planning/fifo.py)
    # The inventory's topology per topology keys, kept with its nodes (inventory.NodeCatalog): largest_plan's
    # `layouts`. None: every plan groups the nodes itself.
    layouts: Layouts | None = field(default=None, compare=False, repr=False)


def cluster_view(nodes: list[dict], pods: list[dict], spec: Any, planned: list[dict] = (),
                 own_uid: str = "", own_pods: list[dict] | None = None, jobs: list[dict] = ()) -> Cluster:
    """The job's view of the cluster: inventory of nodes it may use (nodeSelector, tolerations).

    `pods` are the pods bound to nodes; `planned` are rlkube pods not bound yet. Those of other
    jobs count as using GPUs on their planned node (like the scheduler's assumed pods): two jobs
    planned one after the other never get the same free GPUs, and a plan is never admitted onto
    GPUs another admitted gang is about to bind to. The job's own unbound pods do not count.

    `own_pods`, when given, is a fresher listing of the job's own pods than `pods` (the
    reconciler reads them on every pass; the node-wide listing may be a few seconds old). They
    replace the job's pods in `pods`: a pod of an earlier attempt that is gone no longer holds
    its GPUs, so the attempt planned right after an ElasticGrow teardown sees them free.

    `jobs` are the RLTrainingJobs of the cluster: those waiting for a plan queue first come, first
    served (planning/fifo.py).
    """
    snapshot = snapshot_from_objects(nodes, [*pods, *planned], waiting_jobs(jobs))
    return cluster_view_of(snapshot, spec, own_uid, own_pods)


def cluster_view_of(snapshot: InventorySnapshot, spec: Any, own_uid: str = "",
                    own_pods: list[dict] | None = None) -> Cluster:
    """`cluster_view` on a snapshot (inventory.py): from a watch-fed store or from one listing.

    Other owners' bound and planned pods count where they are; the job's own planned pods do not;
    the job's own bound pods count as `own_pods` (fresher) says, or as the snapshot says when
    `own_pods` is None."""
    used = snapshot.used_by_others(own_uid)
    if own_uid and own_pods is not None:
        own = {}
        for pod in own_pods:
            use = pod_use(pod)
            if own_uid in use.owners and use.bound_gpus:
                own[use.node] = own.get(use.node, 0) + use.bound_gpus
    else:
        own = dict(snapshot.owner_bound.get(own_uid) or {}) if own_uid else {}
    for node, gpus in own.items():
        used[node] = used.get(node, 0) + gpus
    # What follows from the nodes alone comes from the catalog, worked out once per node set
    # (inventory.NodeCatalog); only the GPUs in use are this plan's.
    catalog = snapshot.catalog if snapshot.catalog is not None else NodeCatalog(snapshot.nodes)
    fit = catalog.fit(spec.tolerations, spec.node_selector or {})
    return Cluster(inventory=fit.inventory(used), node_names=catalog.names,
                   own_gpus={node: gpus for node, gpus in own.items() if node in fit.usable},
                   health=catalog.health, excluded=fit.excluded, waiting=tuple(snapshot.waiting),
                   layouts=fit.layout)


def plan_fits(placement: Placement, cluster: Cluster, gpus_per_pod: int) -> str | None:
    """None when every planned node still has the free GPUs its pods need, else why not."""
    need: dict[str, int] = {}
    for plan in placement.pods:
        need[plan.node] = need.get(plan.node, 0) + gpus_per_pod
    free = {n.name: n.gpus_free for n in cluster.inventory}
    for node, gpus in sorted(need.items()):
        if node not in free:
            return f"planned node {node} is gone, unschedulable or not Ready"
        if free[node] < gpus:
            return f"planned node {node} has {free[node]} free GPUs, the plan needs {gpus}"
    return None


def largest_plan(spec: Any, inventory: list[NodeInventory], shared_host_path: bool = True,
                 most: int | None = None, layouts: Layouts | None = None) -> Placement | Unplaceable:
    """The plan at the largest gang size the spec allows (`worker_counts`, none above `most`:
    the pods Kueue admitted) that fits `inventory`; when none fits, the Unplaceable of the
    smallest size, whose reason is the one to fix.

    Without `shared_host_path` (the operator's --host-path-shared: the hostPath checkpoint root is
    one filesystem on every node) a job with no checkpoint.volumeClaim keeps its checkpoints in a
    hostPath of each node, which the other nodes do not see: a gang restarted across nodes would
    lose them (or commit only rank 0's shards). Such a job gets only plans on one node.

    `layouts`: the inventory's topology per keys (`Cluster.layouts`), so no plan groups the nodes
    again; the plan is the same without it."""
    one_node = not shared_host_path and not spec.checkpoint.volume_claim
    counts = [w for w in spec.worker_counts() if most is None or w <= most]
    if not counts:
        return Unplaceable(f"at most {most} pods are admitted, fewer than the smallest gang of "
                           f"{min(spec.worker_counts())} pods")
    failed, spanning = Unplaceable("no gang size to plan"), None
    for workers in counts:
        try:
            request = request_from_spec(spec.with_workers(workers))
            layout = layouts(request.topology_keys) if layouts is not None else None
            plan = plan_placement(request, inventory, layout)
        except Unplaceable as exc:
            failed = exc
            continue
        if not one_node or len({p.node for p in plan.pods}) <= 1:
            return plan
        spanning = spanning or plan
    if spanning is not None:
        nodes = sorted({p.node for p in spanning.pods})
        return Unplaceable(
            f"the gang fits only across {len(nodes)} nodes ({', '.join(nodes)}), and spec.checkpoint.volumeClaim "
            "is not set: its checkpoints would be a hostPath on each node, which the other nodes do not see; "
            "set checkpoint.volumeClaim to a ReadWriteMany claim (or install the operator with "
            "checkpoints.hostPathShared=true when that hostPath root is one shared filesystem on every node)")
    if spec.elastic is not None:
        return Unplaceable(f"elastic: not even minWorkers {spec.elastic.min_workers} pods fit: {failed.reason}")
    return failed
