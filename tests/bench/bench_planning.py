"""The operator's cost of one plan on a large inventory, pure CPU (no cluster).

Run: `.venv/bin/python tests/bench/bench_planning.py [--nodes 1000] [--ahead 0,10,50]`.
A plan (lifecycle/admission.py) reads the cluster view of the inventory (cluster.cluster_view_of)
and first serves every older job still waiting for a plan (fifo.held_back: one placement each),
then places its own gang. Plans are made one at a time (reconcile.py), so this cost, times the
jobs ahead, bounds how many jobs a second the operator can admit. Nodes: `--nodes` kwok-like nodes
of 8 GPUs, 8 to an NVLink clique, the first half full; jobs: bench_operator's (8 GPUs, 8 pods of 1).

Two rows per case: `catalog: kept`, the operator's way (the watch-fed inventory keeps the nodes'
planning catalog, planning/inventory.py, until a node changes), and `catalog: per plan`, the cost
when every plan works the nodes out again (a listed inventory's fresh listing, and every plan
before the catalog existed).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

from bench_operator import SPEC  # noqa: E402

from rlkube.operator.api import parse_spec  # noqa: E402
from rlkube.operator.planning import fifo  # noqa: E402
from rlkube.operator.planning.cluster import cluster_view_of, largest_plan  # noqa: E402
from rlkube.operator.planning.inventory import InventorySnapshot, WaitingJob  # noqa: E402

try:  # absent before the catalog: the same run then measures the older code (per plan only)
    from rlkube.operator.planning.inventory import NodeCatalog  # noqa: E402
except ImportError:
    NodeCatalog = None

TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def nodes(count: int) -> list[dict]:
    return [{"metadata": {"name": f"n{i:04d}", "labels": {"nvidia.com/gpu.clique": f"c{i // 8}"}},
             "spec": {"taints": [TAINT]},
             "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(count)]


def one_plan_ms(count: int, ahead: int, repeat: int, kept: bool) -> tuple[float, float]:
    """(wall, CPU) milliseconds of one plan: CPU time is the figure to compare on a busy machine."""
    spec = parse_spec({**SPEC, "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]})
    waiting = tuple(WaitingJob("bench", f"w{i}", f"uid-w{i}", f"2026-12-04T00:{i // 60:02d}:{i % 60:02d}Z", "", spec)
                    for i in range(ahead))
    listed = nodes(count)
    used = {f"n{i:04d}": 8 for i in range(count // 2)}
    catalog = {"catalog": NodeCatalog(listed)} if kept else {}
    snapshot = InventorySnapshot(listed, used, {}, {}, {}, waiting, (), **catalog)
    if kept:  # the catalog is made once, before the first plan: not part of a plan's cost
        cluster_view_of(snapshot, spec, "uid-me", own_pods=[])
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        cluster = cluster_view_of(snapshot, spec, "uid-me", own_pods=[])
        layouts = getattr(cluster, "layouts", None)
        if layouts is None:
            free, _ = fifo.held_back(cluster.inventory, list(waiting), largest_plan)
            largest_plan(spec, free, True)
        else:
            free, _ = fifo.held_back(cluster.inventory, list(waiting), functools.partial(largest_plan, layouts=layouts))
            largest_plan(spec, free, True, layouts=layouts)
    return (time.perf_counter() - started) / repeat * 1000, (time.process_time() - cpu) / repeat * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ahead", default="0,1,5,10,50", help="older waiting jobs served first (comma-separated)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    for ahead in (int(a) for a in args.ahead.split(",")):
        for kept in ((True, False) if NodeCatalog is not None else (False,)):
            wall, cpu = one_plan_ms(args.nodes, ahead, args.repeat, kept)
            print(json.dumps({"case": "plan", "nodes": args.nodes, "jobs_ahead": ahead,
                              "catalog": "kept" if kept else "per plan", "ms_per_plan": round(wall, 1),
                              "cpu_ms_per_plan": round(cpu, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
