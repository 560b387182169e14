"""First come, first served among gangs waiting for GPUs, with a reservation. Pure.

Each job plans for itself when it is reconciled, so without a rule the job that happens to be
reconciled first when GPUs free up wins, and a large job can wait forever while small jobs that
came after it keep taking the GPUs it needs. The rule (docs/scheduling.md):

- A job waits for a plan while it has none and is not suspended (phase Pending or new); jobs
  queued in Kueue or scheduled by Volcano are theirs to order and are left out (the inventory's
  `waiting_job` tells them apart).
- Within a priority class (spec.priorityClassName), waiting jobs go oldest first: by
  creationTimestamp, then name, then namespace.
- Before a job plans, every older waiting job of its class is served first on the same free GPUs:
  one whose gang fits takes the GPUs of its plan; one that does not fit yet holds back the GPUs it
  needs (taken from the nodes with the most free GPUs), so younger jobs fill only what is left.
  A job that could not fit even on an empty cluster holds nothing back: it would block the queue
  forever.

The reservation is an estimate (the older job's real plan is made when it is reconciled), and it
is enough for the guarantee that matters: no younger job of the same class takes GPUs while an
older one that could use them waits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rlkube.operator.api.observed import JobView
from rlkube.operator.planning.inventory import NodeInventory, WaitingJob
from rlkube.operator.planning.placement import Placement, Unplaceable

# The planner (cluster.largest_plan), passed in: cluster imports this module.
Planner = Callable[[Any, list[NodeInventory]], Placement | Unplaceable]


def ahead_of(job: JobView, waiting: Sequence[WaitingJob]) -> list[WaitingJob]:
    """The waiting jobs of `job`'s priority class that came before it, oldest first."""
    if job.spec is None:
        return []
    mine = (job.created, job.name, job.namespace)
    klass = job.spec.priority_class_name or ""
    return [w for w in waiting if w.uid != job.ref.uid and w.priority_class == klass and w.order < mine]


def held_back(inventory: list[NodeInventory], ahead: Sequence[WaitingJob],
              plan: Planner) -> tuple[list[NodeInventory], list[str]]:
    """`inventory` with the GPUs of the jobs `ahead` taken (their plans, or what they need), and
    the jobs that took any."""
    capacity = sum(n.gpus_allocatable for n in inventory)
    holders = []
    for older in ahead:
        placement = plan(older.spec, inventory)
        if isinstance(placement, Placement):
            per_pod = older.spec.placement.gpus_per_pod
            taken = {}
            for pod in placement.pods:
                taken[pod.node] = taken.get(pod.node, 0) + per_pod
        else:
            need = _smallest_gang_gpus(older.spec)
            if need > capacity:
                continue  # could not run even on an empty cluster: it must not block the queue
            taken = _freest(inventory, need)
        # Only the nodes it takes from change (a thousand-node inventory, once per job ahead).
        inventory = [replace(n, gpus_used=n.gpus_used + taken[n.name]) if n.name in taken else n for n in inventory]
        holders.append(older.label)
    return inventory, holders


def _smallest_gang_gpus(spec: Any) -> int:
    return min((spec.with_workers(w).total_gpus() for w in spec.worker_counts()), default=spec.total_gpus())


def _freest(inventory: list[NodeInventory], need: int) -> dict[str, int]:
    """`need` GPUs taken from the nodes with the most free GPUs first."""
    taken: dict[str, int] = {}
    for node in sorted(inventory, key=lambda n: (-n.gpus_free, n.name)):
        if need <= 0:
            break
        take = min(need, node.gpus_free)
        if take:
            taken[node.name] = take
            need -= take
    return taken
