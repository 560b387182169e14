"""Placement planner: table-driven cases on small clusters, and hypothesis properties."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlkube.operator.planning.inventory import NodeInventory, inventory_from_objects
from rlkube.operator.planning.placement import (
    Placement,
    PlacementRequest,
    Unplaceable,
    plan_placement,
    request_from_spec,
)
from rlkube.runtime.contract.config import RolesSpec, device_map

CLIQUE = "nvidia.com/gpu.clique"
HOST = "kubernetes.io/hostname"
RACK = "rlkube.io/rack"
ZONE = "topology.kubernetes.io/zone"
KEYS = (CLIQUE, HOST, RACK, ZONE)
REWARD_FUNCTION = "rlkube.runtime.rewards:target_pattern"


# ---------------------------------------------------------------------------------- builders


def node(name: str, gpus: int = 8, used: int = 0, clique: str | None = None, rack: str | None = None,
         zone: str | None = "z1", **labels: str) -> NodeInventory:
    """An inventory node; clique/rack/zone labels only when given (None: label missing)."""
    all_labels = {HOST: name, **labels}
    for key, value in ((CLIQUE, clique), (RACK, rack), (ZONE, zone)):
        if value is not None:
            all_labels[key] = value
    return NodeInventory(name=name, gpus_allocatable=gpus, gpus_used=used, labels=all_labels)


def request(actor: int = 1, critic: int = 0, reward: int = 0, *, gpp: int = 1, policy: str = "preferred",
            keys: tuple[str, ...] = KEYS, colocated: dict[str, str] | None = None) -> PlacementRequest:
    """A request for roles with these GPUs (0: absent), ranks numbered by the runtime's device_map."""
    roles: dict = {"actor": {"gpus": actor}}
    if critic:
        roles["critic"] = {"gpus": critic}
    if reward:
        roles["reward"] = {"gpus": reward, "function": REWARD_FUNCTION}
    for name, owner in (colocated or {}).items():
        roles[name] = {"colocateWith": owner}
    return PlacementRequest(device_map=device_map(RolesSpec.model_validate(roles)), colocated=colocated or {},
                            gpus_per_pod=gpp, topology_keys=keys, policy=policy)


def nodes_of(plan: Placement, role: str) -> set[str]:
    ranks = set(plan.device_map[role])
    return {p.node for p in plan.pods if ranks & set(p.ranks)}


# ----------------------------------------------------------------------------- table: plans


@dataclass
class Case:
    name: str
    inventory: list[NodeInventory]
    request: PlacementRequest
    pod_nodes: list[str] | None = None  # expected node of each pod, in index order
    domains: dict[str, str] = field(default_factory=dict)  # expected domains (subset)
    fallback: bool = False
    message_contains: str | None = None


CASES = [
    Case(
        "4-GPU job on one 8-GPU node",
        [node("a", 8, clique="c1")],
        request(4, gpp=4),
        pod_nodes=["a"],
        domains={"actor": f"{CLIQUE}=c1"},
    ),
    Case(
        "actor 2 / critic 1 / reward 1, one GPU per pod, across cliques: each group in one clique",
        # c1 has two nodes with 1 free each (2 in the clique), c2 one node with 2 free.
        [node("a1", 8, 7, clique="c1", rack="r1"), node("a2", 8, 7, clique="c1", rack="r1"),
         node("b1", 8, 6, clique="c2", rack="r1")],
        request(2, 1, 1, gpp=1),
        # The whole job fits no clique; actor (2) best-fits c2 exactly, critic and reward take c1.
        pod_nodes=["b1", "b1", "a1", "a2"],
        domains={"actor": f"{CLIQUE}=c2", "critic": f"{CLIQUE}=c1", "reward": f"{CLIQUE}=c1"},
    ),
    Case(
        "whole job kept in one clique when one has room",
        [node("a1", 8, 6, clique="c1"), node("b1", 8, 4, clique="c2"), node("b2", 8, 6, clique="c2")],
        request(2, 1, 1, gpp=1),
        pod_nodes=["b1", "b1", "b1", "b1"],
    ),
    Case(
        "best fit: the node with 4 free beats the empty 8-GPU node for a 4-GPU job",
        [node("big", 8, 0, clique="c1"), node("small", 8, 4, clique="c1")],
        request(4, gpp=1),
        pod_nodes=["small"] * 4,
    ),
    Case(
        "best fit of domains: the clique the job fills exactly is chosen",
        [node("a1", 8, 0, clique="c1"), node("a2", 8, 0, clique="c1"),
         node("b1", 8, 0, clique="c2"), node("b2", 8, 4, clique="c2")],
        request(8, 4, gpp=4),
        pod_nodes=["b1", "b1", "b2"],
    ),
    Case(
        "several pods of the job on one node",
        [node("a", 8, clique="c1"), node("b", 8, 6, clique="c1")],
        request(4, 2, 2, gpp=2),
        pod_nodes=["a", "a", "a", "a"],
    ),
    Case(
        "a group bigger than a node fills whole nodes, most room first",
        [node("a", 8, 0, rack="r1"), node("b", 8, 0, rack="r1"), node("c", 8, 6, rack="r1")],
        request(12, gpp=2, keys=(HOST, RACK)),
        pod_nodes=["a", "a", "a", "a", "b", "b"],
        domains={"actor": f"{RACK}=r1"},
    ),
    Case(
        "colocated reference shares the actor's pods and domain",
        [node("a", 8, clique="c1")],
        request(2, 0, 1, gpp=1, colocated={"reference": "actor"}),
        pod_nodes=["a", "a", "a"],
        domains={"reference": f"{CLIQUE}=c1", "actor": f"{CLIQUE}=c1"},
    ),
    Case(
        "preferred falls back to the rack when no clique has room, and says so",
        [node("a1", 8, 6, clique="c1", rack="r1"), node("b1", 8, 6, clique="c2", rack="r1")],
        request(4, gpp=1, policy="preferred"),
        pod_nodes=["a1", "a1", "b1", "b1"],
        domains={"actor": f"{RACK}=r1"},
        fallback=True,
        message_contains=f"actor needs 4 GPUs in one {CLIQUE}, largest free is 2",
    ),
    Case(
        "nodes without the clique label are singleton cliques",
        [node("x", 8, 4, clique=None), node("y", 8, 0, clique=None)],
        request(4, gpp=2),
        pod_nodes=["x", "x"],
        domains={"actor": f"{CLIQUE}=<unlabeled node x>"},
    ),
    Case(
        "a pod straddling two roles carries both",
        [node("a", 8, 0, clique="c1"), node("b", 8, 0, clique="c1")],
        request(6, 2, gpp=4),
        pod_nodes=["a", "a"],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_plan_cases(case: Case) -> None:
    plan = plan_placement(case.request, case.inventory)
    if case.pod_nodes is not None:
        assert [p.node for p in plan.pods] == case.pod_nodes
    for role, domain in case.domains.items():
        assert plan.domains[role] == domain
    assert plan.fallback is case.fallback
    if case.message_contains:
        assert any(case.message_contains in m for m in plan.messages), plan.messages
    if not case.fallback:
        assert not any("fallback" in m for m in plan.messages)


def test_straddling_pod_roles_and_ranks() -> None:
    plan = plan_placement(request(6, 2, gpp=4), [node("a", 8), node("b", 8)])
    assert [p.ranks for p in plan.pods] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [p.roles for p in plan.pods] == [("actor",), ("actor", "critic")]


def test_colocated_roles_in_pod_roles() -> None:
    plan = plan_placement(request(2, 0, 2, gpp=2, colocated={"reference": "actor"}), [node("a", 8)])
    assert plan.device_map == {"actor": [0, 1], "reward": [2, 3], "reference": [0, 1]}
    assert [p.roles for p in plan.pods] == [("actor", "reference"), ("reward",)]


# ------------------------------------------------------------------------ table: unplaceable


UNPLACEABLE = [
    ("required clique too small", [node("a1", 8, 6, clique="c1"), node("b1", 8, 6, clique="c2")],
     request(4, policy="required"), f"actor needs 4 GPUs (in pods of 1) in one {CLIQUE}, largest free is 2"),
    ("not enough GPUs at all", [node("a", 8, 6), node("b", 8, 7)], request(4),
     "needs 4 GPUs in 4 pods of 1, only 3 free"),
    ("free GPUs scattered below the pod size", [node("a", 8, 7), node("b", 8, 7)], request(2, gpp=2),
     "only 0 free in pods of 2 (2 free GPUs"),
    ("pod bigger than every node", [node("a", 4)], request(8, gpp=8), "no schedulable node has 8 GPUs"),
    ("required: each role fits alone but not together",
     # One clique has 2 free; actor and critic each need 2 in one clique.
     [node("a1", 8, 6, clique="c1"), node("b1", 8, 7, clique="c2"), node("b2", 8, 7, clique="c3")],
     request(2, 2, policy="required"), "no combination of domains holds every role group"),
]


@pytest.mark.parametrize("inventory,req,reason", [c[1:] for c in UNPLACEABLE], ids=[c[0] for c in UNPLACEABLE])
def test_unplaceable(inventory: list[NodeInventory], req: PlacementRequest, reason: str) -> None:
    with pytest.raises(Unplaceable) as err:
        plan_placement(req, inventory)
    assert reason in err.value.reason, err.value.reason


def test_required_combination_reason_names_roles() -> None:
    # Each group alone fits a clique (c1 has 2 free), but both cannot have one.
    inventory = [node("a1", 8, 6, clique="c1"), node("b1", 8, 7, clique="c2"), node("c1", 8, 7, clique="c3"),
                 node("d1", 8, 7, clique="c4")]
    with pytest.raises(Unplaceable) as err:
        plan_placement(request(2, 2, policy="required"), inventory)
    assert "no combination" in err.value.reason and "critic 2 GPUs in one" in err.value.reason
    preferred = plan_placement(request(2, 2, policy="preferred"), inventory)
    assert preferred.fallback and preferred.domains["actor"] == f"{CLIQUE}=c1"


def test_request_validation_names_field() -> None:
    with pytest.raises(ValueError, match="spec.placement.gpusPerPod: must divide the job's 3 GPUs"):
        request(2, 1, gpp=2)
    with pytest.raises(ValueError, match="spec.placement.policy"):
        request(1, policy="sometimes")


# --------------------------------------------------------------------------------- inventory


def api_node(name: str, gpus: int | str = 8, *, ready: str = "True", unschedulable: bool = False,
             taints: list[dict] | None = None, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {HOST: name}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"},
                   "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]},
    }


def api_pod(node_name: str | None, gpus: int, phase: str = "Running", *, where: str = "requests",
            init: int = 0) -> dict:
    spec: dict = {"containers": [{"name": "c", "resources": {where: {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": init}}}]
    return {"metadata": {"name": f"p-{node_name}-{gpus}"}, "spec": spec, "status": {"phase": phase}}


def test_inventory_counts_requests_and_limits_of_live_bound_pods() -> None:
    nodes = [api_node("b"), api_node("a")]
    pods = [
        api_pod("a", 2),  # counted
        api_pod("a", 1, where="limits"),  # limits imply requests for extended resources
        api_pod("a", 4, phase="Succeeded"),  # terminated: not counted
        api_pod("a", 4, phase="Failed"),
        api_pod(None, 8, phase="Pending"),  # not bound: not counted
        api_pod("b", 3, phase="Pending"),  # bound, not yet running: counted
        api_pod("b", 1, init=2),  # init container larger than the containers: 2
    ]
    inventory = inventory_from_objects(nodes, pods)
    assert [(n.name, n.gpus_allocatable, n.gpus_used, n.gpus_free) for n in inventory] == [
        ("a", 8, 3, 5),
        ("b", 8, 5, 3),
    ]
    assert inventory[0].labels == {HOST: "a"}


def test_inventory_skips_unschedulable_notready_and_tainted() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        api_node("ok"),
        api_node("cordoned", unschedulable=True),
        api_node("notready", ready="False"),
        api_node("unknown", ready="Unknown"),
        api_node("tainted", taints=[gpu_taint]),
        api_node("evicting", taints=[{"key": "maint", "effect": "NoExecute"}]),
        api_node("soft", taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
    ]
    assert [n.name for n in inventory_from_objects(nodes, [])] == ["ok", "soft"]
    tolerate_gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert [n.name for n in inventory_from_objects(nodes, [], tolerations=tolerate_gpu)] == ["ok", "soft", "tainted"]
    tolerate_value = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}]
    assert "tainted" in [n.name for n in inventory_from_objects(nodes, [], tolerations=tolerate_value)]
    wrong_value = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]
    assert "tainted" not in [n.name for n in inventory_from_objects(nodes, [], tolerations=wrong_value)]
    everything = [{"operator": "Exists"}]
    assert len(inventory_from_objects(nodes, [], tolerations=everything)) == 4


def test_inventory_overcommitted_node_has_nothing_free() -> None:
    (a,) = inventory_from_objects([api_node("a", 2)], [api_pod("a", 3)])
    assert a.gpus_free == 0 and a.gpus_used == 3


def test_request_from_spec_duck_typed() -> None:
    roles = RolesSpec.model_validate({
        "actor": {"gpus": 2}, "critic": {"gpus": 1}, "reward": {"gpus": 0}, "reference": {"colocateWith": "critic"},
    })
    spec = SimpleNamespace(roles=roles, device_map=lambda: device_map(roles),
                           placement=SimpleNamespace(gpus_per_pod=1, topology_keys=[CLIQUE, HOST], policy="required"))
    req = request_from_spec(spec)
    assert req.role_gpus == {"actor": 2, "critic": 1}
    assert req.colocated == {"reward": "actor", "reference": "critic"}
    assert req.topology_keys == (CLIQUE, HOST) and req.policy == "required" and req.gpus_per_pod == 1
    plan = plan_placement(req, [node("a", 8)])
    assert plan.device_map == device_map(roles)


def test_request_from_api_spec() -> None:
    from rlkube.operator.api import parse_spec

    spec = parse_spec({
        "algorithm": "ppo", "image": "localhost/rlkube/runtime-cpu:dev",
        "model": {"config": {"model_type": "qwen2"}},
        "roles": {"actor": {"gpus": 2}, "critic": {"gpus": 1}, "reward": {"gpus": 1, "model": {"path": "/m"}},
                  "reference": {"colocateWith": "actor"}},
        "data": {"source": "synthetic", "format": "synthetic"},
        "placement": {"gpusPerPod": 2, "policy": "required"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    })
    req = request_from_spec(spec)
    assert req.role_gpus == {"actor": 2, "critic": 1, "reward": 1}
    assert req.colocated == {"reference": "actor"}
    assert (req.gpus_per_pod, req.policy, req.topology_keys) == (2, "required", KEYS)
    tainted = api_node("t", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    inventory = inventory_from_objects([tainted], [], tolerations=spec.tolerations)
    plan = plan_placement(req, inventory)
    assert plan.device_map == spec.device_map() == device_map(spec.roles)
    assert [(p.node, p.roles) for p in plan.pods] == [("t", ("actor", "reference")), ("t", ("critic", "reward"))]


# -------------------------------------------------------------------------------- properties


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeInventory]:
    count = draw(st.integers(1, 9))
    inventory = []
    for i in range(count):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        used = draw(st.integers(0, gpus))
        labels = {HOST: f"n{i}"}
        for key, values in ((CLIQUE, ["c1", "c2", "c3"]), (RACK, ["r1", "r2"]), (ZONE, ["z1"])):
            value = draw(st.sampled_from([None, *values]))
            if value is not None:
                labels[key] = value
        inventory.append(NodeInventory(f"n{i}", gpus, used, labels))
    return inventory


@st.composite
def roles_specs(draw: st.DrawFn) -> RolesSpec:
    roles: dict = {"actor": {"gpus": draw(st.integers(1, 8))}}
    for name in ("critic", "reward"):
        choice = draw(st.sampled_from(["absent", "gpus", "zero", "colocate"]))
        if choice == "gpus":
            roles[name] = {"gpus": draw(st.integers(1, 4))}
        elif choice == "zero":
            roles[name] = {"gpus": 0}
        elif choice == "colocate":
            roles[name] = {"colocateWith": "actor"}
    if draw(st.booleans()):
        roles["reference"] = {"colocateWith": draw(st.sampled_from(sorted(roles)))}
    return RolesSpec.model_validate(roles)


@st.composite
def requests(draw: st.DrawFn) -> tuple[RolesSpec, PlacementRequest]:
    roles = draw(roles_specs())
    total = roles.total_gpus()
    gpp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if total % d == 0]))
    keys = draw(st.sampled_from([KEYS, (HOST, CLIQUE, RACK, ZONE), (CLIQUE, RACK), ()]))
    spec = SimpleNamespace(roles=roles, device_map=lambda: device_map(roles), placement=SimpleNamespace(
        gpus_per_pod=gpp, topology_keys=keys, policy=draw(st.sampled_from(["required", "preferred"]))))
    return roles, request_from_spec(spec)


def target_levels(req: PlacementRequest, inventory: list[NodeInventory]) -> dict[str, int | None]:
    """Independent restatement of the required rule: first key with a domain big enough by allocatable."""
    g = req.gpus_per_pod
    out: dict[str, int | None] = {}
    first = 0
    for role, gpus in req.role_gpus.items():
        pods = (first + gpus - 1) // g - first // g + 1
        first += gpus
        out[role] = None
        for level, key in enumerate(req.topology_keys):
            capacity: Counter = Counter()
            for n in inventory:
                capacity[n.labels.get(key, "\0" + n.name)] += n.gpus_allocatable // g
            if capacity and max(capacity.values()) >= pods:
                out[role] = level
                break
    return out


def check_plan(roles: RolesSpec, req: PlacementRequest, inventory: list[NodeInventory], plan: Placement) -> None:
    free = {n.name: n.gpus_free for n in inventory}
    g = req.gpus_per_pod
    # never over-commits a node
    for name, pods in Counter(p.node for p in plan.pods).items():
        assert pods * g <= free[name], (name, pods, free[name])
    # every rank placed exactly once, pods of gpus_per_pod contiguous ranks, in index order
    assert sorted(r for p in plan.pods for r in p.ranks) == list(range(req.total_gpus))
    for i, p in enumerate(plan.pods):
        assert p.index == i and p.ranks == tuple(range(i * g, (i + 1) * g))
    # colocated roles share GPUs: the device map is the runtime's, and pods list every role they serve
    assert plan.device_map == device_map(roles)
    for p in plan.pods:
        assert set(p.roles) == {r for r, rs in plan.device_map.items() if set(rs) & set(p.ranks)}
    for role, owner in req.colocated.items():
        assert plan.domains[role] == plan.domains[owner]
    # required never violates its domain
    if req.policy == "required" or not plan.fallback:
        labels = {n.name: n.labels for n in inventory}
        for role, level in target_levels(req, inventory).items():
            if level is None:
                continue
            key = req.topology_keys[level]
            domains = {labels[n].get(key, "\0" + n) for n in nodes_of(plan, role)}
            assert len(domains) == 1, (role, key, domains)


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(requests(), clusters(), st.randoms(use_true_random=False))
def test_properties(rr: tuple[RolesSpec, PlacementRequest], inventory: list[NodeInventory],
                    rnd: random.Random) -> None:
    roles, req = rr
    try:
        plan = plan_placement(req, inventory)
    except Unplaceable as err:
        event("unplaceable")
        assert err.reason
        slots = sum(n.gpus_free // req.gpus_per_pod for n in inventory)
        if req.policy == "preferred":
            assert slots < req.pod_count  # preferred only fails when there is no room at all
        return
    event(f"placed, fallback={plan.fallback}, pods={min(len(plan.pods), 3)}+")
    check_plan(roles, req, inventory, plan)
    # determinism: the inventory's order does not matter
    shuffled = list(inventory)
    rnd.shuffle(shuffled)
    assert plan_placement(req, shuffled) == plan


@SETTINGS
@given(requests(), clusters())
def test_required_fails_exactly_when_preferred_falls_back(rr: tuple[RolesSpec, PlacementRequest],
                                                          inventory: list[NodeInventory]) -> None:
    _, req = rr
    required = replace(req, policy="required")
    preferred = replace(req, policy="preferred")
    try:
        soft = plan_placement(preferred, inventory)
    except Unplaceable:
        with pytest.raises(Unplaceable):
            plan_placement(required, inventory)
        return
    if soft.fallback:
        with pytest.raises(Unplaceable) as err:
            plan_placement(required, inventory)
        assert "policy required" in err.value.reason
        assert any("fallback (policy preferred)" in m for m in soft.messages)
    else:
        assert plan_placement(required, inventory) == soft
