"""Who holds which node's GPUs, reduced from pod objects and added up per node. Pure.

Planning needs, per node, the GPUs that bound, unfinished pods request and the GPUs other rlkube
jobs' pods are planned to take there before they bind (annotations `rlkube.io/planned-node` and
`rlkube.io/gpus`). A pod object is tens of kilobytes; `PodUse` keeps the few facts that count, so
an inventory of thousands of pods stays small, and `GpuUse` keeps the sums per node and per owner
up to date one pod event at a time, so a plan reads them instead of adding up every pod again.

`InventorySnapshot` is what a plan is made on: the nodes, the sums, and the jobs waiting for a
plan (lifecycle/fifo.py), all taken at one moment. It comes either from a watch-fed store
(cluster_state.py) or from one listing (`snapshot_from_objects`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlkube.operator import render
from rlkube.operator.inventory import GPU_RESOURCE, _pod_gpu_request, _quantity_int
from rlkube.runtime.contract.pod import LABEL_ATTEMPT, LABEL_JOB

if TYPE_CHECKING:  # lifecycle/cluster.py imports this module
    from rlkube.operator.lifecycle.catalog import NodeCatalog
    from rlkube.operator.lifecycle.fifo import WaitingJob

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class PodUse:
    """The facts of one pod that GPU accounting reads."""

    key: Key
    owners: tuple[str, ...]     # ownerReferences' uids
    node: str | None            # spec.nodeName: bound
    gpus: int                   # GPUs it requests (counted on `node` while bound and unfinished)
    finished: bool              # Succeeded or Failed: holds nothing
    deleting: bool              # metadata.deletionTimestamp set (still holds GPUs while bound)
    planned_node: str | None    # rlkube pods: the node its plan chose (annotation)
    planned_gpus: int
    attempt: str | None         # label rlkube.io/attempt (rlkube pods)
    job: str | None             # label rlkube.io/job (rlkube pods)

    @property
    def bound_gpus(self) -> int:
        """GPUs it holds on its node now."""
        return self.gpus if self.node and not self.finished else 0

    @property
    def reserved_gpus(self) -> int:
        """GPUs it is about to hold on its planned node (an rlkube pod not bound yet), like the
        scheduler's assumed pods."""
        if self.node or self.finished or self.deleting or not self.planned_node or self.job is None:
            return 0
        return self.planned_gpus

    @property
    def active(self) -> bool:
        """Neither finished nor being deleted: its job has a gang (it is not waiting for a plan)."""
        return not self.finished and not self.deleting


def pod_use(obj: Mapping[str, Any], resource: str = GPU_RESOURCE) -> PodUse:
    """Reduce a pod object (full, or metadata only for an unbound rlkube pod) to its `PodUse`."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    phase = (obj.get("status") or {}).get("phase")
    return PodUse(
        key=(meta.get("namespace") or "", meta.get("name") or ""),
        owners=tuple(ref.get("uid") or "" for ref in meta.get("ownerReferences") or ()),
        node=spec.get("nodeName") or None,
        gpus=_pod_gpu_request(obj, resource) if spec else 0,
        finished=phase in ("Succeeded", "Failed"),
        deleting=bool(meta.get("deletionTimestamp")),
        planned_node=notes.get(render.PLANNED_NODE_ANNOTATION) or None,
        planned_gpus=_quantity_int(notes.get(render.GPUS_ANNOTATION)),
        attempt=labels.get(LABEL_ATTEMPT),
        job=labels.get(LABEL_JOB),
    )


def _add(table: dict[str, int], node: str, gpus: int) -> None:
    left = table.get(node, 0) + gpus
    if left:
        table[node] = left
    else:
        table.pop(node, None)


class GpuUse:
    """GPUs held (bound) and reserved (planned, not bound) per node, in total and per owner uid,
    kept up to date as pods come, change and go. Not thread-safe: its owner locks."""

    def __init__(self) -> None:
        self.pods: dict[Key, PodUse] = {}
        self.bound: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.owner_bound: dict[str, dict[str, int]] = {}
        self.owner_reserved: dict[str, dict[str, int]] = {}
        self.active_owners: dict[str, int] = {}  # owner uid -> its active pods

    def _count(self, use: PodUse, sign: int) -> None:
        if use.bound_gpus:
            _add(self.bound, use.node, sign * use.bound_gpus)
            for uid in use.owners:
                _add(self.owner_bound.setdefault(uid, {}), use.node, sign * use.bound_gpus)
        if use.reserved_gpus:
            _add(self.reserved, use.planned_node, sign * use.reserved_gpus)
            for uid in use.owners:
                _add(self.owner_reserved.setdefault(uid, {}), use.planned_node, sign * use.reserved_gpus)
        if use.active:
            for uid in use.owners:
                _add(self.active_owners, uid, sign)
        for table in (self.owner_bound, self.owner_reserved):
            for uid in use.owners:
                if not table.get(uid, True):
                    del table[uid]

    def put(self, use: PodUse) -> None:
        old = self.pods.get(use.key)
        if old == use:
            return
        if old is not None:
            self._count(old, -1)
        self.pods[use.key] = use
        self._count(use, +1)

    def drop(self, key: Key) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._count(old, -1)


@dataclass(frozen=True)
class InventorySnapshot:
    """What one plan is made on, taken at one moment."""

    nodes: list[dict]                                   # node objects (reduced is fine)
    bound: Mapping[str, int]                            # node -> GPUs of bound, unfinished pods
    reserved: Mapping[str, int]                         # node -> GPUs of unbound rlkube pods planned there
    owner_bound: Mapping[str, Mapping[str, int]]        # owner uid -> node -> its part of `bound`
    owner_reserved: Mapping[str, Mapping[str, int]]     # owner uid -> node -> its part of `reserved`
    waiting: tuple[WaitingJob, ...] = ()                # jobs waiting for a plan, oldest first
    extra: tuple[PodUse, ...] = field(default=())       # pods being created, not in the sums yet
    # `nodes` as a catalog kept between plans (lifecycle/catalog.py); None: one is made of `nodes`.
    catalog: NodeCatalog | None = None

    def used_by_others(self, own_uid: str) -> dict[str, int]:
        """node -> GPUs held or reserved by every pod not owned by `own_uid` (incl. `extra`);
        `own_uid` "": by every pod."""
        used = dict(self.bound)
        for node, gpus in self.reserved.items():
            used[node] = used.get(node, 0) + gpus
        if own_uid:
            for table in (self.owner_bound, self.owner_reserved):
                for node, gpus in (table.get(own_uid) or {}).items():
                    _add(used, node, -gpus)
        for use in self.extra:
            if not own_uid or own_uid not in use.owners:
                for node, gpus in ((use.node, use.bound_gpus), (use.planned_node, use.reserved_gpus)):
                    if gpus:
                        _add(used, node, gpus)
        return used


def snapshot_from_objects(nodes: list[dict], pods: Iterable[Mapping[str, Any]],
                          waiting: Iterable[WaitingJob] = ()) -> InventorySnapshot:
    """A snapshot from one listing: bound pods (full objects) and unbound rlkube pods (metadata)."""
    use = GpuUse()
    for pod in pods:
        reduced = pod_use(pod)
        if reduced.key in use.pods:  # listed twice (bound between two lists): the bound one counts
            reduced = reduced if reduced.node else use.pods[reduced.key]
        use.put(reduced)
    return InventorySnapshot(nodes=nodes, bound=use.bound, reserved=use.reserved, owner_bound=use.owner_bound,
                             owner_reserved=use.owner_reserved, waiting=tuple(waiting))
