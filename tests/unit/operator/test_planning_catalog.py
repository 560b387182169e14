"""The planning catalog (`NodeCatalog` of planning/inventory.py) and the layouts it keeps give the
very plans that working everything out again for each plan gives: over random clusters changed by random node
events, every cluster view and every plan (the older waiting jobs' held-back plans included) made
on a catalog kept between plans equals the one made from the raw nodes with nothing kept."""

from __future__ import annotations

import functools
import random

import pytest

from rlkube.operator.api import parse_spec
from rlkube.operator.controller.cluster_state import NodeStore
from rlkube.operator.planning import fifo
from rlkube.operator.planning import placement as placement_module
from rlkube.operator.planning.cluster import cluster_view_of, largest_plan
from rlkube.operator.planning.inventory import (
    InventorySnapshot,
    WaitingJob,
    node_exclusion,
    node_health,
    node_inventory,
    reduce_node,
)
from rlkube.operator.planning.placement import Placement, Unplaceable

CLIQUE, RACK, ZONE = "nvidia.com/gpu.clique", "rlkube.io/rack", "topology.kubernetes.io/zone"
TAINT = {"key": "gpu-only", "value": "yes", "effect": "NoSchedule"}


def raw_node(rng: random.Random, name: str) -> dict:
    labels = {"kubernetes.io/hostname": name, "pool": rng.choice(["a", "b"])}
    for key, values in ((CLIQUE, 6), (RACK, 3), (ZONE, 2)):
        if rng.random() < 0.8:  # some nodes lack a level: a domain of their own there
            labels[key] = f"{key[-4:]}{rng.randrange(values)}"
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": "1"},
            "spec": {"unschedulable": rng.random() < 0.05, "taints": [TAINT] if rng.random() < 0.2 else []},
            "status": {"allocatable": {"nvidia.com/gpu": str(rng.choice([0, 2, 4, 8, 8, 8]))},
                       "conditions": [{"type": "Ready", "status": "True" if rng.random() < 0.9 else "False",
                                       "lastTransitionTime": "2026-12-04T10:00:00Z",
                                       "lastHeartbeatTime": "2026-12-04T10:00:00Z"}]}}


def mutate(rng: random.Random, nodes: dict[str, dict], serial: list[int]) -> tuple[str, dict, str]:
    """One node event, as the watch would deliver it: (type, node, what changed)."""
    name = rng.choice(sorted(nodes))
    node = {k: v for k, v in nodes[name].items()}
    node["metadata"] = {**node["metadata"], "labels": dict(node["metadata"]["labels"])}
    node["spec"] = dict(node["spec"])
    node["status"] = {**node["status"], "conditions": [dict(c) for c in node["status"]["conditions"]]}
    what = rng.choice(["label", "cordon", "ready", "taint", "allocatable", "delete", "add", "heartbeat"])
    if what == "delete" and len(nodes) > 3:
        return "DELETED", nodes.pop(name), what
    if what == "add":
        serial[0] += 1
        fresh = raw_node(rng, f"node-{serial[0]:03d}")
        nodes[fresh["metadata"]["name"]] = fresh
        return "ADDED", fresh, what
    if what == "label":
        key = rng.choice([CLIQUE, RACK, ZONE, "pool"])
        node["metadata"]["labels"][key] = rng.choice(["c0", "c1", "c9", "a", "b"])
    elif what == "cordon":
        node["spec"]["unschedulable"] = not node["spec"].get("unschedulable")
    elif what == "ready":
        ready = node["status"]["conditions"][0]
        ready.update(status="False" if ready["status"] == "True" else "True", lastTransitionTime="2026-12-04T11:00:00Z")
    elif what == "taint":
        node["spec"]["taints"] = [] if node["spec"].get("taints") else [TAINT]
    elif what == "allocatable":
        node["status"]["allocatable"] = {"nvidia.com/gpu": str(rng.choice([0, 4, 8, 16]))}
    else:  # the kubelet's heartbeat: nothing planning reads
        node["status"]["conditions"][0]["lastHeartbeatTime"] = f"2026-12-04T12:{rng.randrange(60):02d}:00Z"
    nodes[name] = node
    return "MODIFIED", node, what


def random_spec(rng: random.Random):
    gpus = rng.choice([1, 2, 4, 8, 16])
    per_pod = rng.choice([g for g in (1, 2, 4, 8) if gpus % g == 0])
    keys = rng.choice([[CLIQUE, "kubernetes.io/hostname", RACK, ZONE], [RACK, ZONE], [ZONE], [CLIQUE]])
    raw = {"algorithm": "dpo", "model": {"path": "/models/m"},
           "roles": {"actor": {"gpus": gpus}, "reference": {"colocateWith": "actor"}},
           "data": {"source": "synthetic", "format": "synthetic"}, "image": "localhost/rlkube/runtime-cpu:dev",
           "placement": {"gpusPerPod": per_pod, "topologyKeys": keys,
                         "policy": rng.choice(["required", "preferred"])}}
    if rng.random() < 0.5:
        raw["tolerations"] = [{"key": "gpu-only", "operator": "Exists", "effect": "NoSchedule"}]
    if rng.random() < 0.3:
        raw["nodeSelector"] = {"pool": rng.choice(["a", "b"])}
    return parse_spec(raw)


def reference_view(nodes: list[dict], used: dict[str, int], spec) -> tuple[list, dict, dict]:
    """The cluster view as every plan worked it out before the catalog: from the raw nodes."""
    tolerations, selector = list(spec.tolerations), dict(spec.node_selector or {})
    inventory, excluded = [], {}
    for node in nodes:
        meta = node["metadata"]
        why = node_exclusion(node, tolerations)
        if why is None:
            mismatch = sorted(f"{k}={v}" for k, v in selector.items() if meta["labels"].get(k) != v)
            if not mismatch:
                inventory.append(node_inventory(node, used.get(meta["name"], 0)))
                continue
            why = f"do not match nodeSelector {', '.join(mismatch)}"
        excluded[meta["name"]] = why
    health = {n["metadata"]["name"]: node_health(n) for n in nodes}
    return sorted(inventory, key=lambda n: n.name), excluded, health


def outcome(plan: Placement | Unplaceable):
    return plan if isinstance(plan, Placement) else ("unplaceable", plan.reason)


@pytest.mark.parametrize("seed", range(6))
def test_plans_on_a_kept_catalog_equal_plans_worked_out_afresh(seed, monkeypatch):
    rng = random.Random(seed)
    layouts_built = []
    build = placement_module.Layout.of.__func__
    monkeypatch.setattr(placement_module.Layout, "of",
                        classmethod(lambda cls, keys, inv: layouts_built.append(keys) or build(cls, keys, inv)))
    nodes = {f"node-{i:03d}": raw_node(rng, f"node-{i:03d}") for i in range(rng.randrange(8, 40))}
    store, serial = NodeStore(), [100]
    store.replace(list(nodes.values()))
    plans = kept_layouts = 0
    for _ in range(25):
        prior = dict(nodes)
        kind, changed, what = mutate(rng, nodes, serial)
        before = store.catalog()
        store.apply(kind, changed)
        old = prior.get(changed["metadata"]["name"])
        same = kind == "MODIFIED" and reduce_node(old) == reduce_node(changed)  # a value set to what it was
        assert (store.catalog() is before) == same, what
        assert same or what != "heartbeat"  # a heartbeat alone keeps the catalog
        used = {name: rng.randrange(0, 9) for name in nodes if rng.random() < 0.5}
        catalog = store.catalog()
        specs = [random_spec(rng) for _ in range(3)]
        ahead = [WaitingJob("team", f"w{i}", f"uid-w{i}", f"2026-12-04T00:00:0{i}Z", "", s)
                 for i, s in enumerate(specs[1:])]
        snapshot = InventorySnapshot(list(catalog.nodes), used, {}, {}, {}, tuple(ahead), (), catalog=catalog)
        for spec in specs:
            built = len(layouts_built)
            view = cluster_view_of(snapshot, spec)
            free, holders = fifo.held_back(view.inventory, ahead,
                                           functools.partial(largest_plan, layouts=view.layouts))
            cached = largest_plan(spec, free, False, layouts=view.layouts)
            # At most one layout per topology keys for this view's nodes, however many plans it served.
            fresh_layouts = len(layouts_built) - built
            assert fresh_layouts <= len({tuple(s.placement.topology_keys) for s in specs})
            kept_layouts += fresh_layouts == 0
            inventory, excluded, health = reference_view(list(nodes.values()), used, spec)
            assert view.inventory == inventory and view.excluded == excluded and view.health == health
            assert view.node_names == frozenset(nodes)
            free_ref, holders_ref = fifo.held_back(inventory, ahead, largest_plan)
            assert holders == holders_ref and free == free_ref
            assert outcome(cached) == outcome(largest_plan(spec, free_ref, False))
            plans += 1
    assert plans == 75 and kept_layouts > 0  # plans were made on kept layouts, not only on fresh ones


def test_a_heartbeat_keeps_the_catalog_and_a_label_change_replaces_it():
    rng = random.Random(7)
    nodes = [raw_node(rng, f"n{i}") for i in range(4)]
    store = NodeStore()
    store.replace(nodes)
    first = store.catalog()
    beat = {**nodes[0], "status": {**nodes[0]["status"], "conditions": [
        {**nodes[0]["status"]["conditions"][0], "lastHeartbeatTime": "2026-12-04T13:00:00Z"}]}}
    store.apply("MODIFIED", beat)
    assert store.catalog() is first and store.catalogs == 1
    relabelled = {**beat, "metadata": {**beat["metadata"], "labels": {**beat["metadata"]["labels"], CLIQUE: "new"}}}
    store.apply("MODIFIED", relabelled)
    second = store.catalog()
    assert second is not first and store.catalogs == 2
    fit = second.fit([], {})
    assert {n.name: n.labels.get(CLIQUE) for n in fit.base}.get("n0", "new") == "new"
    store.apply("DELETED", relabelled)
    assert "n0" not in store.catalog().names and store.catalogs == 3


def test_a_layout_is_used_only_for_the_nodes_it_was_built_from():
    rng = random.Random(3)
    store = NodeStore()
    store.replace([raw_node(rng, f"n{i}") for i in range(12)])
    fit = store.catalog().fit([{"key": "gpu-only", "operator": "Exists"}], {})
    layout = fit.layout((CLIQUE, RACK))
    inventory = fit.inventory({})
    assert layout.serves((CLIQUE, RACK), inventory)
    assert not layout.serves((RACK,), inventory)
    assert not layout.serves((CLIQUE, RACK), inventory[1:])  # a node fewer (a lost one, say)
    copied = [type(n)(n.name, n.gpus_allocatable, n.gpus_used, dict(n.labels)) for n in inventory]
    assert not layout.serves((CLIQUE, RACK), copied)  # labels not known to be the same ones
