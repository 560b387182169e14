"""The cluster's GPU inventory as placement sees it, read from raw API objects. Pure.

A node counts when it is schedulable, Ready, and carries no NoSchedule/NoExecute taint the job's
pods do not tolerate; its GPUs in use are what its bound, unfinished pods request, counted the way
the scheduler counts them. Nothing here talks to the API: the caller lists nodes and pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"


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


def _quantity_int(value: Any) -> int:
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


def _pod_gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    """GPUs a pod holds on its node: like the scheduler, max(sum of containers, largest init)."""

    def container_request(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        if resource in requests:
            return _quantity_int(requests[resource])
        # Extended resources cannot be overcommitted: a limit alone implies an equal request.
        return _quantity_int((resources.get("limits") or {}).get(resource))

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
        operator = _field(tol, "operator") or "Equal"
        key = _field(tol, "key") or ""
        if operator == "Exists":
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
        used[node_name] = used.get(node_name, 0) + _pod_gpu_request(pod, resource)
    return inventory_from_usage(nodes, used, tolerations, resource)


def node_inventory(node: Mapping[str, Any], used: int, resource: str = GPU_RESOURCE) -> NodeInventory:
    """One node's inventory entry, given the GPUs its pods hold."""
    meta = node.get("metadata") or {}
    allocatable = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(resource))
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
