"""The operator's cost of one plan on a large inventory, pure CPU (no cluster).

Run: `.venv/bin/python tests/bench/bench_planning.py [--nodes 1000] [--ahead 0,10,50]`.
A plan (lifecycle/admission.py) reads the cluster view of the inventory (cluster.cluster_view_of)
and first serves every older job still waiting for a plan (fifo.held_back: one placement each),
then places its own gang. Plans are made one at a time (reconcile.py), so this cost, times the
jobs ahead, bounds how many jobs a second the operator can admit. Nodes: `--nodes` kwok-like nodes
of 8 GPUs, 8 to an NVLink clique, the first half full; jobs: bench_operator's (8 GPUs, 8 pods of 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bench"))

from bench_operator import SPEC  # noqa: E402

from rlkube.operator.api import parse_spec  # noqa: E402
from rlkube.operator.gpu_use import InventorySnapshot  # noqa: E402
from rlkube.operator.lifecycle import fifo  # noqa: E402
from rlkube.operator.lifecycle.cluster import cluster_view_of, largest_plan  # noqa: E402
from rlkube.operator.lifecycle.fifo import WaitingJob  # noqa: E402

TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def nodes(count: int) -> list[dict]:
    return [{"metadata": {"name": f"n{i:04d}", "labels": {"nvidia.com/gpu.clique": f"c{i // 8}"}},
             "spec": {"taints": [TAINT]},
             "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(count)]


def one_plan_ms(count: int, ahead: int, repeat: int) -> float:
    spec = parse_spec({**SPEC, "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]})
    waiting = tuple(WaitingJob("bench", f"w{i}", f"uid-w{i}", f"2026-12-04T00:{i // 60:02d}:{i % 60:02d}Z", "", spec)
                    for i in range(ahead))
    snapshot = InventorySnapshot(nodes(count), {f"n{i:04d}": 8 for i in range(count // 2)}, {}, {}, {}, waiting, ())
    started = time.perf_counter()
    for _ in range(repeat):
        cluster = cluster_view_of(snapshot, spec, "uid-me", own_pods=[])
        free, _ = fifo.held_back(cluster.inventory, list(waiting), largest_plan)
        largest_plan(spec, free, True)
    return (time.perf_counter() - started) / repeat * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ahead", default="0,1,5,10,50", help="older waiting jobs served first (comma-separated)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    for ahead in (int(a) for a in args.ahead.split(",")):
        print(json.dumps({"case": "plan", "nodes": args.nodes, "jobs_ahead": ahead,
                          "ms_per_plan": round(one_plan_ms(args.nodes, ahead, args.repeat), 1)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
