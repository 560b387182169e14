"""Elastic resizing of a running gang (`spec.elastic`: minWorkers..maxWorkers pods). Pure.

Grow: an elastic job running below maxWorkers (and below what Kueue admitted, for a job Kueue
admitted partly) whose larger gang fits now, counting the GPUs its own pods hold as free, ends
its attempt, not counted against backoffLimit (ElasticGrow), so the next attempt is planned at
the larger size. The pods get SIGTERM and checkpoint on the way out; the larger gang resumes
there. Asked only of a gang that runs whole (lifecycle/outcome.py).

Shrink: a gang that loses a node (lifecycle/node_loss.py) is re-planned on what is left, at the
largest size that fits there (planning's `largest_plan`); when that is smaller than the gang was,
the Event ElasticShrink says so. A job that does not fit even at minWorkers stays Pending
(lifecycle/admission.py says why).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from rlkube.operator.lifecycle.decider import Decider, Gang
from rlkube.operator.lifecycle.decision import NEED_CLUSTER, Decision
from rlkube.operator.planning.cluster import largest_plan
from rlkube.operator.planning.placement import Placement, Unplaceable

ELASTIC_GROW = "ElasticGrow"
ELASTIC_SHRINK = "ElasticShrink"


def _largest_with_own_gpus_free(d: Decider, without: Collection[str] = ()) -> Placement | Unplaceable:
    """The largest gang of the job that fits if its own pods' GPUs were free, on the nodes of the
    cluster view but `without`, within what Kueue admitted."""
    assert d.cluster is not None
    held = d.cluster.own_gpus
    free = [replace(n, gpus_used=max(0, n.gpus_used - held.get(n.name, 0)))
            for n in d.cluster.inventory if n.name not in without]
    return largest_plan(d.job.spec, free, d.settings.host_path_shared, most=d.worker_cap(),
                        layouts=d.cluster.layouts)


def grow(d: Decider) -> Decision | None:
    """A teardown that lets the running gang be planned larger, NEED_CLUSTER to find out, or None
    when it runs at its largest size (or the job is not elastic)."""
    spec, placement, cap = d.job.spec, d.s.placement, d.worker_cap()
    assert placement is not None
    running = len(placement.pods)
    if spec.elastic is None:
        return None
    if running >= (spec.elastic.max_workers if cap is None else min(cap, spec.elastic.max_workers)):
        return None
    if d.cluster is None:
        return NEED_CLUSTER
    bigger = _largest_with_own_gpus_free(d)
    if isinstance(bigger, Unplaceable) or len(bigger.pods) <= running:
        return None
    limit = f"maxWorkers {spec.elastic.max_workers}"
    admission = d.kueue_admission()
    if admission is not None and admission.partial:
        limit += f"; {admission.admission_message()}"
    return d.teardown(ELASTIC_GROW, f"elastic: {len(bigger.pods)} pods fit now, running with {running} "
                      f"({limit}): restarting the gang larger from its checkpoint", event_type="Normal")


def note_shrink(d: Decider, gang: Gang, lost: Collection[str]) -> None:
    """An elastic gang that no longer fits at its size without the `lost` nodes: say it shrinks."""
    spec, running = d.job.spec, len(gang.placement.pods)
    if spec.elastic is None or d.cluster is None:
        return
    smaller = _largest_with_own_gpus_free(d, without=set(lost))
    if isinstance(smaller, Unplaceable) or len(smaller.pods) >= running:
        return
    d.event("Normal", ELASTIC_SHRINK, f"elastic: {len(smaller.pods)} pods fit without node(s) "
            f"{', '.join(sorted(lost))}, running with {running} (minWorkers {spec.elastic.min_workers}): "
            "restarting the gang smaller from its checkpoint")
