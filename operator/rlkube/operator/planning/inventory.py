"""The cluster's GPU inventory: what a plan is made on, read from raw API objects. Pure.

One module, one public interface (`__all__`); nothing here talks to the API. The caller lists or
watches nodes, pods and RLTrainingJobs (controller/cluster_state.py keeps them by watches) and
hands the objects here:

- Nodes. A node counts when it is schedulable, Ready, and carries no NoSchedule/NoExecute taint
  the job's pods do not tolerate (`node_exclusion`); `NodeInventory` is one such node with its
  GPUs allocatable and in use, counted the way the scheduler counts them (`pod_gpu_request`).
  `reduce_node` keeps the few fields of a node that planning reads.
- The node catalog. Every plan reads every node: whether the job's pods may use it, its health
  (node-loss detection, lifecycle/node_loss.py) and its topology domains (`Layout`). None of that
  depends on pods, and nodes change far less often than plans are made: at 1,000 nodes, working
  it out again for every plan (and for every older waiting job each plan serves first,
  planning/fifo.py) was most of a plan's cost. A `NodeCatalog` is one set of nodes that never
  changes; it answers each of those questions once (per tolerations and nodeSelector, and per
  topology keys for a layout) and gives the same answer to every later plan. The watch-fed
  inventory starts a new catalog when a node event changes what planning reads of a node: that is
  the invalidation. A listing gets a catalog of its own.
- GPU use. Planning needs, per node, the GPUs that bound, unfinished pods request and the GPUs
  other rlkube jobs' pods are planned to take there before they bind (annotations
  `rlkube.io/planned-node` and `rlkube.io/gpus`). A pod object is tens of kilobytes; `PodUse`
  keeps the few facts that count, so an inventory of thousands of pods stays small, and `GpuUse`
  keeps the sums per node and per owner up to date one pod event at a time, so a plan reads them
  instead of adding up every pod again.
- Waiting jobs. `WaitingJob` is an RLTrainingJob waiting for its gang to be planned, as the
  queue (planning/fifo.py) sees it.

`InventorySnapshot` is what a plan is made on: the nodes, the sums, and the jobs waiting for a
plan, all taken at one moment. It comes either from a watch-fed store or from one listing
(`snapshot_from_objects`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkube.operator.api import parse_spec
from rlkube.operator.api.observed import GPUS_ANNOTATION, PLANNED_NODE_ANNOTATION, JobRef, uses_gang_gate
from rlkube.runtime.contract.pod import LABEL_ATTEMPT, LABEL_JOB

__all__ = [
    "GPU_RESOURCE",
    "OUT_OF_SERVICE_TAINT",
    "GpuUse",
    "InventorySnapshot",
    "Domain",
    "Key",
    "Layout",
    "NodeCatalog",
    "NodeFit",
    "NodeHealth",
    "NodeInventory",
    "PodUse",
    "WaitingJob",
    "inventory_from_objects",
    "inventory_from_usage",
    "node_exclusion",
    "node_health",
    "node_inventory",
    "pod_gpu_request",
    "pod_use",
    "quantity_int",
    "reduce_node",
    "snapshot_from_objects",
    "waiting_job",
    "waiting_jobs",
]

GPU_RESOURCE = "nvidia.com/gpu"

Key = tuple[str, str]  # (namespace, name)
# A topology domain: ("=", label value), or ("node", node name) for a node without the label.
Domain = tuple[str, str]
_NAME, _LABELS = operator.attrgetter("name"), operator.attrgetter("labels")


@dataclass(frozen=True)
class NodeInventory:
    """One schedulable node as placement sees it: GPUs allocatable and in use, and its labels."""

    name: str
    gpus_allocatable: int
    gpus_used: int
    labels: Mapping[str, str] = field(default_factory=dict)
    # Worked out once: a plan reads it for every node, for every older job it serves first.
    gpus_free: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A node whose allocatable shrank below what its pods hold has nothing free, not less.
        object.__setattr__(self, "gpus_free", max(0, self.gpus_allocatable - self.gpus_used))


def quantity_int(value: Any) -> int:
    """An integer resource quantity ("8", 8, "2k" is not a GPU count) as int; junk counts as 0."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        try:
            return int(float(text))
        except ValueError:
            return 0


def pod_gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    """GPUs a pod holds on its node: like the scheduler, max(sum of containers, largest init)."""

    def container_request(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        if resource in requests:
            return quantity_int(requests[resource])
        # Extended resources cannot be overcommitted: a limit alone implies an equal request.
        return quantity_int((resources.get("limits") or {}).get(resource))

    spec = pod.get("spec") or {}
    regular = sum(container_request(c) for c in spec.get("containers") or [])
    init = max((container_request(c) for c in spec.get("initContainers") or []), default=0)
    return max(regular, init)


def _field(obj: Any, name: str) -> Any:
    """A field of an API dict, or the attribute of a typed object (rlkube.operator.api.Toleration)."""
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Any]) -> bool:
    """Whether a taint is tolerated, by the Kubernetes matching rules (key, operator, value, effect)."""
    for tol in tolerations:
        effect = _field(tol, "effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        op = _field(tol, "operator") or "Equal"
        key = _field(tol, "key") or ""
        if op == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (_field(tol, "value") or "") == (taint.get("value") or ""):
            return True
    return False


def _node_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_exclusion(node: Mapping[str, Any], tolerations: Sequence[Any] = ()) -> str | None:
    """Why placement cannot use `node` for pods with `tolerations`, in words; None when it can."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "are cordoned (spec.unschedulable)"
    if not _node_ready(node):
        return "are not Ready"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"have taint {taint.get('key')}{value}:{taint.get('effect')} the pods do not tolerate"
    return None


def inventory_from_objects(
    nodes: list[dict],
    pods: list[dict],
    tolerations: Sequence[Any] | None = None,
    resource: str = GPU_RESOURCE,
) -> list[NodeInventory]:
    """The schedulable nodes with their GPU use, from raw API objects (camelCase dicts).

    Skipped: nodes with `spec.unschedulable`, nodes not Ready, and nodes with a NoSchedule or
    NoExecute taint that `tolerations` (the job's pod tolerations: API dicts or
    `rlkube.operator.api.Toleration`) do not tolerate.
    Used GPUs are the `resource` requests (or limits, when only limits are set) of pods bound to
    the node (`spec.nodeName`) that are not Succeeded or Failed. Sorted by node name.
    """
    used: dict[str, int] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node_name or phase in ("Succeeded", "Failed"):
            continue
        used[node_name] = used.get(node_name, 0) + pod_gpu_request(pod, resource)
    return inventory_from_usage(nodes, used, tolerations, resource)


def node_inventory(node: Mapping[str, Any], used: int, resource: str = GPU_RESOURCE) -> NodeInventory:
    """One node's inventory entry, given the GPUs its pods hold."""
    meta = node.get("metadata") or {}
    allocatable = quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(resource))
    return NodeInventory(name=meta["name"], gpus_allocatable=allocatable, gpus_used=used,
                         labels=dict(meta.get("labels") or {}))


def inventory_from_usage(
    nodes: list[dict],
    used: Mapping[str, int],
    tolerations: Sequence[Any] | None = None,
    resource: str = GPU_RESOURCE,
) -> list[NodeInventory]:
    """The schedulable nodes (as `inventory_from_objects` picks them), with `used[node]` GPUs in
    use on each. Sorted by node name."""
    tolerations = list(tolerations or [])
    inventory = [node_inventory(node, used.get((node.get("metadata") or {})["name"], 0), resource)
                 for node in nodes if node_exclusion(node, tolerations) is None]
    return sorted(inventory, key=lambda n: n.name)


def reduce_node(node: Mapping[str, Any]) -> dict:
    """The fields of a node that planning reads (`node_exclusion`, `node_health`, `NodeCatalog`).
    The Ready condition keeps its status and transition time, not its heartbeat: a kubelet's
    heartbeat then leaves the reduced node equal, and the planning catalog stands."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    return {
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {})},
        "spec": {"unschedulable": spec.get("unschedulable", False), "taints": list(spec.get("taints") or [])},
        "status": {"allocatable": dict(status.get("allocatable") or {}),
                   "conditions": [{k: c[k] for k in ("type", "status", "lastTransitionTime") if k in c}
                                  for c in status.get("conditions") or [] if c.get("type") == "Ready"]},
    }


# -- node health, topology and the catalog -------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """The topology domains of a set of nodes at `keys`: what a plan derives from node names and
    labels alone. A thousand nodes at four levels take milliseconds to group, more than the rest of
    a plan, so the operator builds it once per node set (`NodeCatalog`, rebuilt when a node
    event changes a node) and reuses it for every plan on those nodes; `plan_placement` checks that
    it fits the inventory it is given and builds its own when it does not."""

    keys: tuple[str, ...]
    names: tuple[str, ...]                              # the nodes, sorted
    labels: tuple[Mapping[str, str], ...]               # each node's labels object, in `names` order
    node_domain: tuple[dict[str, Domain], ...]         # level -> node -> domain
    domain_nodes: tuple[dict[Domain, tuple[str, ...]], ...]  # level -> domain -> node names (sorted)

    @classmethod
    def of(cls, keys: tuple[str, ...], inventory: Iterable[NodeInventory]) -> Layout:
        nodes = sorted(inventory, key=lambda n: n.name)
        if len({n.name for n in nodes}) != len(nodes):
            raise ValueError("inventory: node names must be unique")
        node_domain, domain_nodes = [], []
        for key in keys:
            of_node = {n.name: ("=", n.labels[key]) if key in n.labels else ("node", n.name) for n in nodes}
            members: dict[Domain, list[str]] = {}
            for name, domain in of_node.items():
                members.setdefault(domain, []).append(name)
            node_domain.append(of_node)
            domain_nodes.append({d: tuple(ns) for d, ns in sorted(members.items())})
        return cls(tuple(keys), tuple(n.name for n in nodes), tuple(n.labels for n in nodes),
                   tuple(node_domain), tuple(domain_nodes))

    def serves(self, keys: tuple[str, ...], inventory: Sequence[NodeInventory]) -> bool:
        """Whether this is `inventory`'s layout at `keys`: the same nodes in name order, each with
        the very labels object the layout was built from (so no label can have changed since)."""
        return (tuple(keys) == self.keys and len(inventory) == len(self.names)
                and list(map(_NAME, inventory)) == list(self.names)
                and all(map(operator.is_, map(_LABELS, inventory), self.labels)))


# Kubernetes' taint for a node shut down without a graceful drain (non-graceful node shutdown):
# its pods will never report again.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


@dataclass(frozen=True)
class NodeHealth:
    """What node-loss detection reads of a node (lifecycle/node_loss.py)."""

    ready: str                  # its Ready condition's status: True, False or Unknown ("" when none)
    since: str | None           # that condition's lastTransitionTime
    out_of_service: bool        # tainted node.kubernetes.io/out-of-service (non-graceful shutdown)


def node_health(node: Mapping[str, Any]) -> NodeHealth:
    ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
    taints = (node.get("spec") or {}).get("taints") or []
    return NodeHealth(ready=str(ready.get("status") or ""), since=ready.get("lastTransitionTime"),
                      out_of_service=any(t.get("key") == OUT_OF_SERVICE_TAINT for t in taints))


@dataclass(frozen=True)
class NodeFit:
    """The nodes that pods with given tolerations and nodeSelector may use, and why not the others."""

    usable: frozenset[str]          # neither cordoned, nor not Ready, nor tainted against the pods
    base: tuple[NodeInventory, ...]  # usable nodes matching the selector, no GPUs in use, by name
    excluded: Mapping[str, str]     # node -> why the pods cannot use it
    _layouts: dict[tuple[str, ...], Layout] = field(default_factory=dict, compare=False, repr=False)

    def inventory(self, used: Mapping[str, int]) -> list[NodeInventory]:
        """The nodes with `used[node]` GPUs in use each, sorted by name. A node with none in use is
        the catalog's own entry, so its labels are the very object its layouts were built from."""
        return [NodeInventory(n.name, n.gpus_allocatable, used[n.name], n.labels) if used.get(n.name) else n
                for n in self.base]

    def layout(self, keys: Sequence[str]) -> Layout:
        """The topology of these nodes at `keys`, built on first use."""
        keys = tuple(keys)
        found = self._layouts.get(keys)
        if found is None:
            found = self._layouts[keys] = Layout.of(keys, self.base)
        return found


def _selection_key(tolerations: Iterable[Any], selector: Mapping[str, str]) -> tuple:
    return (tuple((_field(t, "key"), _field(t, "operator"), _field(t, "value"), _field(t, "effect"))
                  for t in tolerations),
            tuple(sorted(selector.items())))


class NodeCatalog:
    """One set of nodes (raw API objects, or the reduced ones of `reduce_node`) and
    what planning derives from them alone, memoized. Never changed once made: a changed node makes
    a new catalog."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self.nodes = tuple(nodes)
        self.health: Mapping[str, NodeHealth] = {(n.get("metadata") or {}).get("name"): node_health(n)
                                                 for n in self.nodes}
        self.names = frozenset(self.health)
        self._fits: dict[tuple, NodeFit] = {}

    def fit(self, tolerations: Sequence[Any], selector: Mapping[str, str]) -> NodeFit:
        """The nodes pods with `tolerations` and nodeSelector `selector` may use (`NodeFit`)."""
        key = _selection_key(tolerations, selector)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = self._fit(list(tolerations), dict(selector))
        return found

    def _fit(self, tolerations: list[Any], selector: dict[str, str]) -> NodeFit:
        base, excluded, usable = [], {}, set()
        for node in self.nodes:
            meta = node.get("metadata") or {}
            name = meta.get("name")
            why = node_exclusion(node, tolerations)
            if why is None:
                usable.add(name)
                labels = meta.get("labels") or {}
                mismatch = sorted(f"{k}={v}" for k, v in selector.items() if labels.get(k) != v)
                if not mismatch:
                    base.append(node_inventory(node, 0))
                    continue
                why = f"do not match nodeSelector {', '.join(mismatch)}"
            excluded[name] = why
        base.sort(key=lambda n: n.name)
        return NodeFit(frozenset(usable), tuple(base), excluded)

# -- GPU use of pods -----------------------------------------------------------------------


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
        gpus=pod_gpu_request(obj, resource) if spec else 0,
        finished=phase in ("Succeeded", "Failed"),
        deleting=bool(meta.get("deletionTimestamp")),
        planned_node=notes.get(PLANNED_NODE_ANNOTATION) or None,
        planned_gpus=quantity_int(notes.get(GPUS_ANNOTATION)),
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

# -- jobs waiting for a plan ---------------------------------------------------------------


@dataclass(frozen=True)
class WaitingJob:
    """A job waiting for its gang to be planned, as the queue sees it."""

    namespace: str
    name: str
    uid: str
    created: str                # metadata.creationTimestamp (RFC 3339, so it sorts as text)
    priority_class: str         # spec.priorityClassName, "" when unset
    spec: Any                   # the parsed spec

    @property
    def order(self) -> tuple[str, str, str]:
        return self.created, self.name, self.namespace

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def waiting_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[WaitingJob]:
    """The jobs among `jobs` (raw API objects) that wait for a plan, oldest first."""
    return sorted((w for w in map(waiting_job, jobs) if w is not None), key=lambda w: w.order)


def waiting_job(obj: Mapping[str, Any], parse: Callable[[Mapping[str, Any]], Any] | None = None) -> WaitingJob | None:
    """`obj` (a raw RLTrainingJob) as a `WaitingJob`, or None when it does not wait for a plan.
    `parse` turns the object into its spec (a caching parser, say); default `parse_spec`."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("placement") or status.get("phase") not in (None, "", "Pending"):
        return None
    try:
        spec = parse(obj) if parse is not None else parse_spec(obj.get("spec") or {})
    except Exception:  # pydantic.ValidationError: the job fails on its own reconcile
        return None
    ref = JobRef(name=meta.get("name") or "", namespace=meta.get("namespace") or "default",
                 uid=meta.get("uid") or "", labels=dict(meta.get("labels") or {}))
    if spec.run_policy.suspend or not uses_gang_gate(ref, spec):
        return None
    return WaitingJob(ref.namespace, ref.name, ref.uid, str(meta.get("creationTimestamp") or ""),
                      spec.priority_class_name or "", spec)

# -- the snapshot a plan is made on --------------------------------------------------------


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
    # `nodes` as a catalog kept between plans; None: one is made of `nodes`.
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
