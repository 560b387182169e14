"""The tiny DPO job of examples/ (what `make demo` runs), applied with kubectl, trained by the CPU
runtime image on two nodes, reconciled by the operator that Helm installed.

The example's 2 GPUs fit on one node of the harness (2 fake GPUs each), and the planner rightly
keeps the actor's group inside one NVLink clique. To run across two nodes the test asks for 4
GPUs in pods of 2: the cluster's whole capacity, one pod per node, two trainer processes in each
(world size 4 over gloo, rendezvous through the headless Service's DNS names).

What a user sees is what is checked: `kubectl get rltj` (phase, step, tokens/s) and the job's
Events, in the order that tells its story.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

STORY = ["Placed", "Admitted", "Running", "Succeeded"]  # Event reasons, in this order


def _subsequence(wanted: list[str], seen: list[str]) -> bool:
    it = iter(seen)
    return all(any(r == w for r in it) for w in wanted)


def test_tiny_dpo_job_trains_across_two_nodes_and_succeeds(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name = deployed.job_name("dpo")
    job = deploy.job_manifest(name, ns, roles={"actor": {"gpus": 4}, "reference": {"colocateWith": "actor"}},
                              placement={"gpusPerPod": 2})
    steps = job["spec"]["training"]["steps"]
    deploy.apply(cluster, job)
    try:
        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=420)

        # Two pods of two (fake) GPUs each, planned on the two nodes.
        placed = done["status"]["placement"]["pods"]
        assert len(placed) == 2 and len({p["node"] for p in placed}) == 2, placed
        pods = deploy.job_pods(cluster, ns, name)
        assert {p["spec"]["nodeName"] for p in pods} == {p["node"] for p in placed}
        assert all(p["status"]["phase"] == "Succeeded" for p in pods), [p["status"]["phase"] for p in pods]
        assert done["status"]["restarts"] == 0

        progress = done["status"]["progress"]
        assert progress["step"] == steps, progress
        assert progress["tokensPerSecond"] > 0, progress

        # kubectl get rltj: the printer columns a user reads.
        table = cluster.kubectl("get", "rltj", name, "-n", ns).splitlines()
        header = table[0].split()
        assert header[:6] == ["NAME", "PHASE", "ALGORITHM", "GPUS", "STEP", "TOKENS/S"], table
        row = dict(zip(header, table[1].split(), strict=True))
        assert row["PHASE"] == "Succeeded" and row["ALGORITHM"] == "dpo" and row["GPUS"] == "4", table
        assert row["STEP"] == str(steps), table
        assert re.fullmatch(r"[0-9.]+(e[+-]?[0-9]+)?", row["TOKENS/S"]) and float(row["TOKENS/S"]) > 0, table

        # The job's Events tell the story, in order.
        reasons = [e["reason"] for e in deploy.events(cluster, ns, name)]
        assert _subsequence(STORY, reasons), reasons
        placed_event = next(e for e in deploy.events(cluster, ns, name) if e["reason"] == "Placed")
        assert all(p["node"] in placed_event["message"] for p in placed), placed_event["message"]
    finally:
        deploy.delete_job(cluster, ns, name)
    # Children go by ownerReference garbage collection.
    deploy.wait_until("the job's pods to be garbage-collected", lambda: not deploy.job_pods(cluster, ns, name), 120)
