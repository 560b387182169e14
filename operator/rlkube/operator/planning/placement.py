"""Placement: which node each pod of an RLTrainingJob runs on, and which global ranks it holds.

A pure function of the job's request and the cluster's GPU inventory; it never talks to the API.

Ranks and pods. The job's GPUs are numbered as global ranks. Each role with GPUs of its own has
a contiguous range in canonical order (actor first): the device map, which placement takes as
input from `rlkube.runtime.contract.config.device_map` (the one place ranks are numbered).
Colocated roles (and roles with `gpus: 0`, which run on the actor's processes) share the range of
the role they run on. Ranks are packed into pods of `gpus_per_pod` consecutive ranks, so pod i
holds ranks [i*g, (i+1)*g); a pod runs on one node, a node may host several pods of the job, and
no node is ever given more GPUs than it has free (the inventory: `rlkube.operator.planning.inventory`).

Topology. `topology_keys` are node labels, tightest level first (for example
`nvidia.com/gpu.clique`, `kubernetes.io/hostname`, `rlkube.io/rack`,
`topology.kubernetes.io/zone`). At each level the nodes sharing a label value form a domain; a
node without the label is a domain of its own at that level. Levels are taken in the order
given and need not nest. Capacity is counted in pod slots (a node with 7 free GPUs holds 3 pods
of 2), since a pod never spans nodes.

The role group of a role is the set of pods holding its ranks. Its *target level* is the FIRST
topology key at which some domain is large enough, by allocatable capacity (free or not), to
hold the group; a group larger than every domain at every level has no target level and may go
anywhere. A group "lies in a domain" when all of its pods are on nodes of that one domain.

Search, in order; the first step that succeeds is the plan:
1. Whole job tight: one node first, then each level, tightest first; for each domain able to
   hold the whole job with its free GPUs (best fit first: the domain whose free GPUs the job
   fills most exactly, then by name), place every group at its target level inside it.
2. Every group at its target level, anywhere in the cluster (backtracking over the choice of
   domain per group, bounded by a fixed number of attempts).
In steps 1-2 a group's domains are tried in this order: those already holding some of the job's
pods, then those where it would span the fewest nodes, then best fit, then by name.
3. policy "preferred" only: greedily, group by group, the tightest level from the target level
   outwards that still holds the group, else any nodes. The plan then has `fallback=True` and a
   message naming each group that missed its target level.
policy "required" means: every role group lies within one domain of its target level. When
steps 1-2 find no such plan with the current free GPUs, `Unplaceable` is raised with a reason
naming the key, the GPUs needed and the largest free in one domain (the job stays Pending).
Not enough free GPUs in pods of `gpus_per_pod` at all is `Unplaceable` under either policy.

Inside a chosen domain the pods of a group go to as few nodes as possible, best fit: if one node
can take all remaining pods, the one left with the fewest free GPUs; otherwise the node with the
most room first. Big free blocks thus stay whole for later jobs (low fragmentation), and a group
goes to one node whenever its chosen domain has a node with room for all of it. Every tie is
broken by name, so the same request and inventory give the same plan in any inventory order.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# GPU_RESOURCE is imported from here by render, which names what a pod requests.
from rlkube.operator.planning.inventory import GPU_RESOURCE, Domain, Layout, NodeInventory  # noqa: F401

HOSTNAME_KEY = "kubernetes.io/hostname"
POLICIES = ("required", "preferred")

# Backtracking in search steps 1-2 stops after this many attempts to pack a group into a domain,
# so a hopeless required placement on a large cluster fails in milliseconds, not minutes.
MAX_PACK_ATTEMPTS = 20_000


# ----------------------------------------------------------------------------------------------
# Request and result


@dataclass(frozen=True)
class PlacementRequest:
    """What placement needs from a job: its device map, pod size, topology levels and policy.

    The device map is the runtime's (`rlkube.runtime.contract.config.device_map`), taken as it
    is: placement packs those ranks into pods and never numbers them itself, so the ranks a pod
    is planned for are the ranks its trainer builds its process groups from.
    """

    device_map: dict[str, list[int]]  # role -> global ranks, canonical order (actor first)
    colocated: dict[str, str]  # role -> role with GPUs of its own whose ranks it shares
    gpus_per_pod: int
    topology_keys: tuple[str, ...]  # tightest first
    policy: str = "preferred"  # "required" | "preferred"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"spec.placement.policy: must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.gpus_per_pod < 1:
            raise ValueError(f"spec.placement.gpusPerPod: must be >= 1, got {self.gpus_per_pod}")
        if self.role_gpus.get("actor", 0) < 1:
            raise ValueError("spec.roles.actor.gpus: must be >= 1")
        for name, gpus in self.role_gpus.items():
            if gpus < 1:
                raise ValueError(f"spec.roles.{name}.gpus: roles with GPUs of their own need >= 1, got {gpus}")
        for name, owner in self.colocated.items():
            if owner not in self.role_gpus:
                raise ValueError(f"spec.roles.{name}.colocateWith: {owner!r} has no GPUs of its own")
            if self.device_map.get(name) != self.device_map[owner]:
                raise ValueError(f"device map: {name} shares the GPUs of {owner}, so it needs ranks "
                                 f"{self.device_map[owner]}, got {self.device_map.get(name)}")
        # Pods hold consecutive ranks, so each group's pods follow from its range only when the
        # ranges are consecutive too (true of every map the runtime makes).
        first = 0
        for name in self.role_gpus:
            ranks = self.device_map[name]
            if ranks != list(range(first, first + len(ranks))):
                raise ValueError(f"device map: {name} needs ranks from {first} on, consecutive, got {ranks}")
            first += len(ranks)
        if self.total_gpus % self.gpus_per_pod:
            raise ValueError(
                f"spec.placement.gpusPerPod: must divide the job's {self.total_gpus} GPUs, "
                f"got {self.gpus_per_pod}"
            )

    @property
    def role_gpus(self) -> dict[str, int]:
        """GPUs of each role with GPUs of its own, in device-map order."""
        return {name: len(ranks) for name, ranks in self.device_map.items() if name not in self.colocated}

    @property
    def total_gpus(self) -> int:
        return sum(self.role_gpus.values())

    @property
    def pod_count(self) -> int:
        return self.total_gpus // self.gpus_per_pod


def request_from_spec(spec: Any) -> PlacementRequest:
    """The placement request of an `RLTrainingJobSpec` (`.roles`, `.placement`, `.device_map()`)."""
    device_map = spec.device_map()
    own = [name for name, role in spec.roles.present().items() if role.gpus]
    # A role without GPUs of its own runs on the ranks of the group it shares (the actor's, for a
    # role with `gpus: 0`): the one own group whose ranks the device map gave it.
    colocated = {
        name: next((owner for owner in own if device_map[owner] == ranks), "actor")
        for name, ranks in device_map.items()
        if name not in own
    }
    placement = spec.placement
    return PlacementRequest(
        device_map=device_map,
        colocated=colocated,
        gpus_per_pod=placement.gpus_per_pod,
        topology_keys=tuple(placement.topology_keys),
        policy=placement.policy,
    )


@dataclass(frozen=True)
class PodPlan:
    """One pod of the plan: its index (NODE_RANK), node, global ranks and the roles it serves."""

    index: int
    node: str
    ranks: tuple[int, ...]
    roles: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """A whole plan: pods in index order, the device map, and what was decided and why."""

    pods: tuple[PodPlan, ...]
    device_map: dict[str, list[int]]
    # role -> "key=value" of the first level whose one domain holds the role's group; a group on
    # one node that no key labels gets "kubernetes.io/hostname=<node>", one spanning every level "*"
    domains: dict[str, str]
    fallback: bool
    messages: tuple[str, ...]


class Unplaceable(Exception):
    """No plan exists with the current free GPUs; `.reason` says why, for the job's status."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ----------------------------------------------------------------------------------------------
# Topology model

_NAME, _FREE = operator.attrgetter("name"), operator.attrgetter("gpus_free")


@dataclass
class _Topology:
    """Nodes (by name) and their domains at every level (a `Layout`); free capacity counted in pod
    slots."""

    keys: tuple[str, ...]
    gpus_per_pod: int
    nodes: dict[str, NodeInventory]
    node_domain: Sequence[dict[str, Domain]]  # level -> node -> domain
    domain_nodes: Sequence[dict[Domain, tuple[str, ...]]]  # level -> domain -> node names (sorted)
    free_gpus: dict[str, int]  # node -> its free GPUs (NodeInventory.gpus_free, read once)
    free_slots: dict[str, int]  # node -> pods of gpus_per_pod its free GPUs hold

    @classmethod
    def build(cls, keys: tuple[str, ...], gpus_per_pod: int, inventory: Iterable[NodeInventory],
              layout: Layout | None = None) -> _Topology:
        listed = list(inventory)
        if layout is None or not layout.serves(keys, listed):
            layout = Layout.of(keys, listed)
            listed = sorted(listed, key=lambda n: n.name)
        nodes = {n.name: n for n in listed}
        g = gpus_per_pod
        free_gpus = dict(zip(map(_NAME, listed), map(_FREE, listed), strict=True))
        free_slots = free_gpus if g == 1 else {name: free // g for name, free in free_gpus.items()}
        return cls(keys, g, nodes, layout.node_domain, layout.domain_nodes, free_gpus, free_slots)

    def slots_allocatable(self, name: str) -> int:
        return self.nodes[name].gpus_allocatable // self.gpus_per_pod

    def slots_free(self, name: str) -> int:
        return self.free_slots[name]

    def domain_label(self, level: int, domain: Domain) -> str:
        kind, value = domain
        key = self.keys[level]
        return f"{key}={value}" if kind == "=" else f"{key}=<unlabeled node {value}>"

    def largest_free(self, level: int) -> int:
        """Most GPUs usable in pods of gpus_per_pod in one domain of the level, before this job."""
        return max(
            (sum(self.slots_free(n) for n in ns) * self.gpus_per_pod for ns in self.domain_nodes[level].values()),
            default=0,
        )

    def common_level(self, node_names: Iterable[str]) -> int | None:
        """The first level at which all the given nodes lie in one domain (None: no level)."""
        names = set(node_names)
        for level, of_node in enumerate(self.node_domain):
            if len({of_node[n] for n in names}) <= 1:
                return level
        return None

    def common_domain(self, node_names: Iterable[str]) -> str:
        """ "key=value" of the tightest domain holding all the nodes ("*" when none does)."""
        names = sorted(set(node_names))
        level = self.common_level(names)
        if level is not None:
            return self.domain_label(level, self.node_domain[level][names[0]])
        if len(names) == 1:
            return f"{HOSTNAME_KEY}={names[0]}"
        return "*"


@dataclass(frozen=True)
class _Group:
    """A role with GPUs of its own and the pods holding its ranks."""

    role: str
    gpus: int
    pods: tuple[int, ...]
    target_level: int | None  # first level with a domain big enough by allocatable capacity


class _Search:
    """Mutable state of one plan search: the node of each pod and the slots the job takes."""

    def __init__(self, topo: _Topology, groups: list[_Group], pod_count: int) -> None:
        self.topo = topo
        self.groups = groups
        self.assigned: list[str | None] = [None] * pod_count
        self.taken: dict[str, int] = {}
        self.attempts = 0

    def room(self, name: str) -> int:
        return self.topo.slots_free(name) - self.taken.get(name, 0)

    def job_nodes(self) -> set[str]:
        return {n for n in self.assigned if n is not None}

    def assign(self, moves: list[tuple[int, str]]) -> None:
        for pod, name in moves:
            self.assigned[pod] = name
            self.taken[name] = self.taken.get(name, 0) + 1

    def unassign(self, moves: list[tuple[int, str]]) -> None:
        for pod, name in moves:
            self.assigned[pod] = None
            self.taken[name] -= 1

    def pack(self, pods: list[int], candidates: Sequence[str]) -> list[tuple[int, str]] | None:
        """Put pods (in index order) on as few candidate nodes as possible, best fit; None if no room."""
        self.attempts += 1
        g = self.topo.gpus_per_pod
        room = {n: self.room(n) for n in candidates if self.room(n) > 0}
        if sum(room.values()) < len(pods):
            return None
        used_by_job = self.job_nodes()
        moves: list[tuple[int, str]] = []
        remaining = list(pods)
        while remaining:
            need = len(remaining)
            fitting = [n for n, r in room.items() if r >= need]
            if fitting:
                # Best fit: leave the fewest free GPUs behind; then stay on the job's own nodes.
                chosen = min(
                    fitting,
                    key=lambda n: (
                        self.topo.free_gpus[n] - (self.taken.get(n, 0) + need) * g,  # noqa: B023
                        n not in used_by_job,
                        n,
                    ),
                )
                take = need
            else:
                chosen = min(room, key=lambda n: (-room[n], n not in used_by_job, n))
                take = room[chosen]
            moves.extend((pod, chosen) for pod in remaining[:take])
            remaining = remaining[take:]
            del room[chosen]
        return moves

    def candidates(self, group: _Group, level: int | None, restrict: frozenset[str] | None) -> list[tuple[str, ...]]:
        """Node sets (domains at `level`, within `restrict`) that could take the group's open pods."""
        open_pods = [p for p in group.pods if self.assigned[p] is None]
        fixed = {self.assigned[p] for p in group.pods if self.assigned[p] is not None}
        if level is None:
            pools = [tuple(sorted(restrict)) if restrict is not None else tuple(self.topo.nodes)]
        elif restrict is None:
            pools = list(self.topo.domain_nodes[level].values())
        else:  # only the domains holding a node of `restrict` (the others' pools would be empty)
            of_node, members = self.topo.node_domain[level], self.topo.domain_nodes[level]
            pools = [tuple(n for n in members[d] if n in restrict) for d in sorted({of_node[n] for n in restrict})]
        g = self.topo.gpus_per_pod
        job = self.job_nodes()
        scored = []
        for pool in pools:
            if not fixed <= set(pool):
                continue
            room = sum(self.room(n) for n in pool)
            if room < len(open_pods):
                continue
            free = sum(self.topo.free_gpus[n] - self.taken.get(n, 0) * g for n in pool)
            touches = bool(job & set(pool))
            # Fewest nodes the group would span in this pool (most room first), then best fit.
            spans, left = 0, len(open_pods)
            for r in sorted((self.room(n) for n in pool), reverse=True):
                if left <= 0:
                    break
                spans, left = spans + 1, left - r
            scored.append(((not touches, spans, free - len(open_pods) * g, pool), pool))
        return [pool for _, pool in sorted(scored)]

    def place_strict(self, k: int, restrict: frozenset[str] | None) -> bool:
        """Backtracking: groups k.. each inside one domain of its target level (within restrict)."""
        if k == len(self.groups):
            return True
        if k == 0 and not all(self.candidates(gr, gr.target_level, restrict) for gr in self.groups):
            return False  # some group has no room at its target level even alone: no need to search
        group = self.groups[k]
        open_pods = [p for p in group.pods if self.assigned[p] is None]
        for pool in self.candidates(group, group.target_level, restrict):
            if self.attempts >= MAX_PACK_ATTEMPTS:
                return False
            moves = self.pack(open_pods, pool)
            if moves is None:
                continue
            self.assign(moves)
            if self.place_strict(k + 1, restrict):
                return True
            self.unassign(moves)
        return False

    def place_relaxed(self) -> None:
        """Greedy fallback: each group at the tightest level from its target outwards, else anywhere."""
        levels = len(self.topo.keys)
        for group in self.groups:
            open_pods = [p for p in group.pods if self.assigned[p] is None]
            start = group.target_level if group.target_level is not None else levels
            placed = False
            for level in [*range(start, levels), None]:
                for pool in self.candidates(group, level, None):
                    moves = self.pack(open_pods, pool)
                    if moves is not None:
                        self.assign(moves)
                        placed = True
                        break
                if placed:
                    break
            # Total room was checked before the search, and "anywhere" includes every node.
            assert placed, f"relaxed placement found no room for {group.role}"


# ----------------------------------------------------------------------------------------------
# Planning


def _groups(request: PlacementRequest, topo: _Topology) -> list[_Group]:
    g = request.gpus_per_pod
    groups = []
    for role, gpus in request.role_gpus.items():
        ranks = request.device_map[role]
        pods = tuple(range(ranks[0] // g, ranks[-1] // g + 1))
        target = None
        for level, domains in enumerate(topo.domain_nodes):
            if any(sum(topo.slots_allocatable(n) for n in ns) >= len(pods) for ns in domains.values()):
                target = level
                break
        groups.append(_Group(role, gpus, pods, target))
    return groups


def _ranges(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _unplaceable_reason(request: PlacementRequest, topo: _Topology, groups: list[_Group], exhausted: bool) -> str:
    g = request.gpus_per_pod
    for group in groups:
        if group.target_level is None:
            continue
        need = len(group.pods) * g
        largest = topo.largest_free(group.target_level)
        if largest < need:
            return (
                f"policy required: role {group.role} needs {need} GPUs (in pods of {g}) in one "
                f"{topo.keys[group.target_level]}, largest free is {largest}"
            )
    wants = ", ".join(
        f"{gr.role} {len(gr.pods) * g} GPUs in one {topo.keys[gr.target_level]}"
        for gr in groups
        if gr.target_level is not None
    )
    limit = " (search limit reached)" if exhausted else ""
    return f"policy required: no combination of domains holds every role group at once ({wants}){limit}"


def plan_placement(request: PlacementRequest, inventory: list[NodeInventory],
                   layout: Layout | None = None) -> Placement:
    """Plan the job's pods onto nodes (see the module docstring for the rules); or raise Unplaceable.
    `layout`: the inventory's topology at the request's keys, built earlier (`Layout`); the plan is
    the same with or without it."""
    g = request.gpus_per_pod
    topo = _Topology.build(request.topology_keys, g, inventory, layout)
    groups = _groups(request, topo)

    if not any(topo.slots_allocatable(n) for n in topo.nodes):
        raise Unplaceable(f"no schedulable node has {g} GPUs allocatable (gpusPerPod {g})")
    usable = sum(topo.free_slots.values()) * g
    if usable < request.total_gpus:
        raw = sum(topo.free_gpus.values())
        raise Unplaceable(
            f"needs {request.total_gpus} GPUs in {request.pod_count} pods of {g}, only {usable} free "
            f"in pods of {g} ({raw} free GPUs on {len(topo.nodes)} schedulable nodes)"
        )

    search = _Search(topo, groups, request.pod_count)
    found = False
    # Step 1: the whole job inside one domain, tightest level first, best fit first. A single node
    # comes before every key: it lies inside one domain of every level, whatever the labels say.
    pod_count, total_gpus = request.pod_count, request.total_gpus  # properties: once, not per domain
    # One node alone: only those with room for the whole job (most nodes of a busy cluster have not).
    single_nodes = [(topo.free_gpus[n] - total_gpus, (n,)) for n, room in topo.free_slots.items()
                    if room >= pod_count]
    for domains in [None, *topo.domain_nodes]:
        if domains is None:
            fits = single_nodes
        else:
            fits = []
            for members in domains.values():
                room = sum(topo.free_slots[n] for n in members)
                if room >= pod_count:
                    free = sum(topo.free_gpus[n] for n in members)
                    fits.append((free - total_gpus, members))
        for _, members in sorted(fits):
            if search.place_strict(0, frozenset(members)):
                found = True
                break
            if search.attempts >= MAX_PACK_ATTEMPTS:
                break
        if found or search.attempts >= MAX_PACK_ATTEMPTS:
            break
    # Step 2: every group at its own target level, anywhere.
    if not found and search.attempts < MAX_PACK_ATTEMPTS:
        found = search.place_strict(0, None)
    if not found:
        if request.policy == "required":
            raise Unplaceable(_unplaceable_reason(request, topo, groups, search.attempts >= MAX_PACK_ATTEMPTS))
        # Step 3: preferred falls back.
        search = _Search(topo, groups, request.pod_count)
        search.place_relaxed()

    return _result(request, topo, groups, [n for n in search.assigned if n is not None])


def _result(request: PlacementRequest, topo: _Topology, groups: list[_Group], nodes_of_pod: list[str]) -> Placement:
    g = request.gpus_per_pod
    device_map = {role: list(ranks) for role, ranks in request.device_map.items()}
    pods = []
    for index, node in enumerate(nodes_of_pod):
        ranks = tuple(range(index * g, (index + 1) * g))
        roles = tuple(r for r, rs in device_map.items() if set(rs) & set(ranks))
        pods.append(PodPlan(index=index, node=node, ranks=ranks, roles=roles))

    domains: dict[str, str] = {}
    messages = []
    fallback = False
    job_nodes = set(nodes_of_pod)
    messages.append(
        f"job: {request.total_gpus} GPUs in {request.pod_count} pods of {g} on {len(job_nodes)} "
        f"node(s), within {topo.common_domain(job_nodes)}"
    )
    for group in groups:
        group_nodes = sorted({nodes_of_pod[p] for p in group.pods})
        domains[group.role] = topo.common_domain(group_nodes)
        ranks = device_map[group.role]
        messages.append(
            f"{group.role}: ranks {_ranges(ranks)} in pod{'s' if len(group.pods) > 1 else ''} "
            f"{_ranges(group.pods)} on "
            f"{', '.join(group_nodes)}, within {domains[group.role]}"
        )
        if group.target_level is None:
            continue
        level = topo.common_level(group_nodes)
        if level is None or level > group.target_level:
            fallback = True
            key = topo.keys[group.target_level]
            need = len(group.pods) * g
            largest = topo.largest_free(group.target_level)
            why = (
                f"largest free is {largest}"
                if largest < need
                else f"the {key} domains with {need} free are needed by this job's other role groups"
            )
            messages.append(
                f"fallback (policy preferred): {group.role} needs {need} GPUs in one {key}, {why}; "
                f"placed within {domains[group.role]} instead"
            )
    for role, owner in request.colocated.items():
        domains[role] = domains[owner]
    order = list(device_map)
    return Placement(
        pods=tuple(pods),
        device_map=device_map,
        domains={r: domains[r] for r in order},
        fallback=fallback,
        messages=tuple(messages),
    )
