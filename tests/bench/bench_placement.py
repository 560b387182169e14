"""Placement benchmark: rlkube's planner against a simulation of the default kube-scheduler.

Run: `.venv/bin/python tests/bench/bench_placement.py` (about a minute on one core; `--seeds 1` for
a quick look). Prints one JSON object per case, then a table; `--markdown` prints the table as
Markdown for docs/benchmarks.md.

Cluster: 64 nodes x 8 GPUs. `nvidia.com/gpu.clique` names a multi-node NVLink domain of 8 nodes
(64 GPUs, as in a rack-scale NVLink system), so there are 8 cliques; `rlkube.io/rack` groups 2
cliques (4 racks of 16 nodes), `topology.kubernetes.io/zone` 2 racks (2 zones). rlkube plans with
the default keys, tightest first: clique, hostname, rack, zone.

Jobs: a seeded stream of PPO/GRPO/DPO jobs of 1, 2, 4, 8, 16 or 32 GPUs with roles actor,
critic, reward (reference colocated with the actor, so it takes no GPUs) and gpusPerPod 8, 4, 2
or 1 (mostly the largest that divides the job). Two cases:
- fill:  jobs arrive, nothing leaves, until the GPUs asked for reach 90% of the cluster.
- churn: 800 arrivals; each job runs for an exponentially distributed time, so the cluster is
  offered ~90% load and departures leave holes (where fragmentation costs admissions).
A job that cannot be placed on arrival is rejected (no queue), the same for every planner.

Planners:
- rlkube: `plan_placement` with policy preferred; the job is admitted when a plan exists.
- kube-scheduler (peer): what the default scheduler does with the same pods and no affinities:
  pods one by one in index order, filter nodes with enough free GPUs, score NodeResourcesFit
  LeastAllocated (most free after binding wins; GPUs stand for the cpu/memory that the default
  scoring weighs, which such pods request in proportion), ties broken at random (seeded) as the
  scheduler's host selection does. It is given gang admission for free: if any pod of a job
  cannot bind, the job's pods are unbound. That flatters the peer (without gang admission the
  bound pods of a rejected job would hold their GPUs).
- kube-scheduler MostAllocated: the same with the bin-packing score a cluster admin can configure;
  shown to separate topology from mere packing.

Figures (means over seeds):
- groups_one_clique: share of role groups (roles with GPUs of their own) of admitted jobs whose
  pods all lie in one clique; multi_pod_groups_one_clique: the same over groups of 2+ pods (a
  one-pod group is trivially inside a node); groups_one_node: groups on a single node.
- fragmentation: share of free GPUs on nodes that cannot host a pod of the most common pod size
  (GPU-weighted mode of the stream, 8); fill: at the end; churn: mean over arrivals after 100.
- jobs_admitted, gpus_admitted; plan_ms: rlkube's mean planning time per job.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rlkube.operator.planning.inventory import NodeInventory
from rlkube.operator.planning.placement import PlacementRequest, Unplaceable, plan_placement
from rlkube.runtime.contract.config import RolesSpec, device_map

CLIQUE = "nvidia.com/gpu.clique"
HOST = "kubernetes.io/hostname"
RACK = "rlkube.io/rack"
ZONE = "topology.kubernetes.io/zone"
KEYS = (CLIQUE, HOST, RACK, ZONE)

NODES = 64
GPUS_PER_NODE = 8
NODES_PER_CLIQUE = 8
CLIQUES_PER_RACK = 2
RACKS_PER_ZONE = 2
FILL_TARGET = 0.9
CHURN_ARRIVALS = 800
CHURN_WARMUP = 100
SIZE_WEIGHTS = {1: 0.2, 2: 0.2, 4: 0.2, 8: 0.2, 16: 0.12, 32: 0.08}


def node_labels(i: int) -> dict[str, str]:
    clique = i // NODES_PER_CLIQUE
    rack = clique // CLIQUES_PER_RACK
    return {
        HOST: f"gpu-{i:02d}",
        CLIQUE: f"nvl-{clique}",
        RACK: f"rack-{rack}",
        ZONE: f"zone-{rack // RACKS_PER_ZONE}",
    }


def cluster_labels() -> dict[str, dict[str, str]]:
    return {f"gpu-{i:02d}": node_labels(i) for i in range(NODES)}


@dataclass(frozen=True)
class Job:
    name: str
    algorithm: str
    role_gpus: dict[str, int]
    gpus_per_pod: int
    duration: float  # churn only

    @property
    def gpus(self) -> int:
        return sum(self.role_gpus.values())

    @property
    def pods(self) -> int:
        return self.gpus // self.gpus_per_pod

    def request(self) -> PlacementRequest:
        # Ranks numbered by the runtime's device_map, the one place they are numbered.
        roles: dict = {name: {"gpus": gpus} for name, gpus in self.role_gpus.items()}
        if "reward" in roles:
            roles["reward"]["function"] = "rlkube.runtime.rewards:target_pattern"
        roles["reference"] = {"colocateWith": "actor"}
        return PlacementRequest(
            device_map=device_map(RolesSpec.model_validate(roles)),
            colocated={"reference": "actor"},
            gpus_per_pod=self.gpus_per_pod,
            topology_keys=KEYS,
            policy="preferred",
        )

    def role_pods(self) -> dict[str, list[int]]:
        """Pod indices of each role with GPUs (same rule as the planner: contiguous ranks)."""
        out, first, g = {}, 0, self.gpus_per_pod
        for role, n in self.role_gpus.items():
            out[role] = list(range(first // g, (first + n - 1) // g + 1))
            first += n
        return out


def roles_for(size: int, rnd: random.Random) -> tuple[str, dict[str, int]]:
    """A plausible role split: PPO actor/critic/reward 2:1:1, GRPO actor/reward 3:1, DPO actor only."""
    options: list[tuple[str, dict[str, int]]] = [("dpo", {"actor": size})]
    if size >= 2:
        options.append(("grpo", {"actor": size - max(1, size // 4), "reward": max(1, size // 4)}))
    if size >= 4:
        options.append(("ppo", {"actor": size // 2, "critic": size // 4, "reward": size // 4}))
    return rnd.choice(options)


def pod_size_for(size: int, rnd: random.Random) -> int:
    largest = min(size, GPUS_PER_NODE)
    smaller = [d for d in (4, 2, 1) if d < largest and size % d == 0]
    if not smaller or rnd.random() < 0.6:
        return largest
    return rnd.choice(smaller)


def job_stream(seed: int, count: int | None, mean_duration: float = 1.0) -> list[Job]:
    """Seeded jobs; `count` None: until the GPUs asked for reach FILL_TARGET of the cluster."""
    rnd = random.Random(seed)
    sizes, weights = zip(*SIZE_WEIGHTS.items(), strict=True)
    jobs: list[Job] = []
    asked = 0
    while True:
        if count is not None and len(jobs) >= count:
            break
        size = rnd.choices(sizes, weights)[0]
        if count is None and asked + size > FILL_TARGET * NODES * GPUS_PER_NODE:
            break
        algorithm, role_gpus = roles_for(size, rnd)
        jobs.append(
            Job(f"job-{len(jobs):03d}", algorithm, role_gpus, pod_size_for(size, rnd), rnd.expovariate(1 / mean_duration))
        )
        asked += size
    return jobs


# ----------------------------------------------------------------------------------- planners

Planner = Callable[[Job, dict[str, int]], "list[str] | None"]  # job, used GPUs per node -> node per pod


def rlkube_planner(labels: dict[str, dict[str, str]], timings: list[float]) -> Planner:
    def plan(job: Job, used: dict[str, int]) -> list[str] | None:
        inventory = [NodeInventory(n, GPUS_PER_NODE, used[n], labels[n]) for n in labels]
        start = time.perf_counter()
        try:
            placement = plan_placement(job.request(), inventory)
        except Unplaceable:
            return None
        finally:
            timings.append(time.perf_counter() - start)
        return [p.node for p in placement.pods]

    return plan


def scheduler_planner(seed: int, most_allocated: bool = False) -> Planner:
    """Pods one by one: filter by free GPUs, score LeastAllocated (or MostAllocated), random ties."""
    rnd = random.Random(seed)

    def plan(job: Job, used: dict[str, int]) -> list[str] | None:
        taken: Counter = Counter()
        nodes = []
        for _ in range(job.pods):
            feasible = [n for n in used if GPUS_PER_NODE - used[n] - taken[n] >= job.gpus_per_pod]
            if not feasible:
                return None  # gang admission given for free: nothing of this job stays bound

            def score(n: str) -> int:
                after = GPUS_PER_NODE - used[n] - taken[n] - job.gpus_per_pod  # noqa: B023
                fraction = after / GPUS_PER_NODE
                return int(100 * (1 - fraction if most_allocated else fraction))

            best = max(score(n) for n in feasible)
            chosen = rnd.choice(sorted(n for n in feasible if score(n) == best))
            taken[chosen] += job.gpus_per_pod
            nodes.append(chosen)
        return nodes

    return plan


# ------------------------------------------------------------------------------------ metrics


def fragmentation(used: dict[str, int], pod_size: int) -> float:
    free = {n: GPUS_PER_NODE - u for n, u in used.items()}
    total = sum(free.values())
    return sum(f for f in free.values() if f < pod_size) / total if total else 0.0


@dataclass
class Tally:
    groups: int = 0
    groups_clique: int = 0
    groups_node: int = 0
    multi: int = 0
    multi_clique: int = 0
    jobs: int = 0
    jobs_clique: int = 0
    gpus: int = 0

    def add(self, job: Job, nodes: list[str], labels: dict[str, dict[str, str]]) -> None:
        self.jobs += 1
        self.gpus += job.gpus
        self.jobs_clique += len({labels[n][CLIQUE] for n in nodes}) == 1
        for pods in job.role_pods().values():
            on = {nodes[p] for p in pods}
            one_clique = len({labels[n][CLIQUE] for n in on}) == 1
            self.groups += 1
            self.groups_clique += one_clique
            self.groups_node += len(on) == 1
            if len(pods) > 1:
                self.multi += 1
                self.multi_clique += one_clique


def run_case(case: str, jobs: list[Job], planner: Planner, pod_size: int,
             depart: Callable[[Job], None] | None = None) -> dict[str, float]:
    """Feed the jobs to `planner` in order (churn: with departures, announced to `depart`)."""
    labels = cluster_labels()
    used = dict.fromkeys(labels, 0)
    tally = Tally()
    running: list[tuple[float, Job, list[str]]] = []  # (end time, job, node of each pod)
    samples = []
    for t, job in enumerate(jobs):
        if case == "churn":
            for _end, done, nodes in [r for r in running if r[0] <= t]:
                if depart is not None:
                    depart(done)
                for n in nodes:
                    used[n] -= done.gpus_per_pod
            running = [r for r in running if r[0] > t]
        nodes = planner(job, used)
        if nodes is not None:
            for n in nodes:
                used[n] += job.gpus_per_pod
                assert used[n] <= GPUS_PER_NODE, f"{n} over-committed"
            tally.add(job, nodes, labels)
            running.append((t + job.duration, job, nodes))
        if case == "churn" and t >= CHURN_WARMUP:
            samples.append(fragmentation(used, pod_size))
    frag = statistics.fmean(samples) if case == "churn" else fragmentation(used, pod_size)
    return {
        "groups_one_clique": tally.groups_clique / max(1, tally.groups),
        "multi_pod_groups_one_clique": tally.multi_clique / max(1, tally.multi),
        "groups_one_node": tally.groups_node / max(1, tally.groups),
        "jobs_one_clique": tally.jobs_clique / max(1, tally.jobs),
        "fragmentation": frag,
        "jobs_admitted": tally.jobs,
        "gpus_admitted": tally.gpus,
        "jobs_offered": len(jobs),
    }


def common_pod_size(jobs: list[Job]) -> int:
    weight: Counter = Counter()
    for job in jobs:
        weight[job.gpus_per_pod] += job.gpus
    return max(weight, key=lambda s: (weight[s], s))


def case_jobs(case: str, seed: int, arrivals: int = CHURN_ARRIVALS) -> list[Job]:
    if case == "fill":
        return job_stream(seed, None)
    mean_size = sum(s * w for s, w in SIZE_WEIGHTS.items()) / sum(SIZE_WEIGHTS.values())
    # Little's law: one arrival per time unit, so mean duration = target GPUs in use / mean size.
    mean_duration = FILL_TARGET * NODES * GPUS_PER_NODE / mean_size
    return job_stream(seed, arrivals, mean_duration)


METRICS = ("groups_one_clique", "multi_pod_groups_one_clique", "groups_one_node", "jobs_one_clique",
           "fragmentation", "jobs_admitted", "gpus_admitted")


def table(rows: list[tuple], header: tuple[str, ...], markdown: bool) -> str:
    """Rows of (case, metric, numbers or None...) as aligned text or Markdown."""

    def fmt(v: object) -> str:
        if v is None:
            return ""
        if isinstance(v, str):
            return v
        if math.isinf(v):  # type: ignore[arg-type]
            return "inf"
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"  # type: ignore[arg-type]

    lines = [[fmt(v) for v in row] for row in rows]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [list(header), *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)

    setup = {
        "nodes": NODES, "gpus_per_node": GPUS_PER_NODE, "cliques": NODES // NODES_PER_CLIQUE,
        "racks": NODES // (NODES_PER_CLIQUE * CLIQUES_PER_RACK),
        "zones": NODES // (NODES_PER_CLIQUE * CLIQUES_PER_RACK * RACKS_PER_ZONE),
        "topology_keys": list(KEYS), "job_sizes": SIZE_WEIGHTS, "seeds": list(range(args.seeds)),
        "python": platform.python_version(),
    }
    rows = []
    for case in ("fill", "churn"):
        results: dict[str, list[dict[str, float]]] = {"rlkube": [], "kube-scheduler": [], "kube-scheduler-most": []}
        timings: list[float] = []
        pod_sizes = []
        for seed in range(args.seeds):
            jobs = case_jobs(case, seed)
            pod_size = common_pod_size(jobs)
            pod_sizes.append(pod_size)
            results["rlkube"].append(run_case(case, jobs, rlkube_planner(cluster_labels(), timings), pod_size))
            results["kube-scheduler"].append(run_case(case, jobs, scheduler_planner(seed), pod_size))
            results["kube-scheduler-most"].append(
                run_case(case, jobs, scheduler_planner(seed, most_allocated=True), pod_size)
            )
        means = {p: {m: statistics.fmean(r[m] for r in rs) for m in [*METRICS, "jobs_offered"]}
                 for p, rs in results.items()}
        record = {
            "case": case, "setup": setup, "reference_pod_size": Counter(pod_sizes).most_common(1)[0][0],
            "rlkube_plan_ms_mean": 1000 * statistics.fmean(timings),
            "rlkube_plan_ms_max": 1000 * max(timings),
            "mean": means, "per_seed": results,
        }
        print(json.dumps(record, sort_keys=True))
        for metric in METRICS:
            ours, peer, most = (means[p][metric] for p in ("rlkube", "kube-scheduler", "kube-scheduler-most"))
            ratio = ours / peer if peer else math.inf
            rows.append((case, metric, ours, peer, ratio, most))
        rows.append((case, "plan_ms (rlkube, mean/max)", 1000 * statistics.fmean(timings), 1000 * max(timings),
                     None, None))

    print(table(rows, ("case", "metric", "rlkube", "kube-scheduler", "ratio", "MostAllocated"), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
