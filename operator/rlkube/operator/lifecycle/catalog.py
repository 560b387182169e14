"""The cluster's nodes as planning reads them, with what follows from the nodes alone worked out
once. Pure.

Every plan reads every node: whether the job's pods may use it (cordoned, Ready, taints against
the job's tolerations, its nodeSelector), its health (node-loss detection, lifecycle/nodes.py) and
its topology domains (`placement.Layout`). None of that depends on pods, and nodes change far less
often than plans are made: at 1,000 nodes, working it out again for every plan (and for every
older waiting job each plan serves first, fifo.held_back) was most of a plan's cost (issue 20's
profile). A `NodeCatalog` is one set of nodes that never changes; it answers each of those
questions once (per tolerations and nodeSelector, and per topology keys for a layout) and gives
the same answer to every later plan. The watch-fed inventory (cluster_state.NodeStore) starts a
new catalog when a node event changes what planning reads of a node: that is the invalidation. A
listing gets a catalog of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlkube.operator.inventory import NodeInventory, _field, node_exclusion, node_inventory
from rlkube.operator.placement import Layout

# Kubernetes' taint for a node shut down without a graceful drain (non-graceful node shutdown):
# its pods will never report again.
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


@dataclass(frozen=True)
class NodeHealth:
    """What node-loss detection reads of a node (lifecycle/nodes.py)."""

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
    """One set of nodes (raw API objects, or the reduced ones of cluster_state.reduce_node) and
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
