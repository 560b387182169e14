"""kwok fake nodes from the harness: Ready, labelled, with GPUs the real scheduler counts."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.cluster.kwok import TAINT, FakeNode

pytestmark = pytest.mark.integration


def _wait(what, condition, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _pod(name: str, node: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "localhost/rlkube/none:dev",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],  # fmt: skip
        },
    }


def test_kwok_nodes_are_ready_and_their_gpus_are_scheduled(control_plane):
    tag = uuid.uuid4().hex[:5]
    nodes = [
        FakeNode(f"kwok-{tag}-{i}", {"nvidia.com/gpu.clique": f"nvl-{i // 2}", "topology.kubernetes.io/zone": "zone-k",
                                     "rlkube.io/rack": f"rack-{i // 2}"}, gpus=8)  # fmt: skip
        for i in range(4)
    ]
    ns = f"kwok-{tag}"
    control_plane.kubectl("create", "namespace", ns)
    try:
        control_plane.add_kwok_nodes(nodes)
        listed = json.loads(control_plane.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json"))["items"]
        by_name = {n["metadata"]["name"]: n for n in listed}
        for n in nodes:
            got = by_name[n.name]
            assert got["status"]["allocatable"]["nvidia.com/gpu"] == "8"
            assert got["metadata"]["labels"]["nvidia.com/gpu.clique"] == n.labels["nvidia.com/gpu.clique"]

        target = nodes[0].name
        control_plane.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(_pod("all-eight", target, 8)))

        def phase(name):
            return control_plane.kubectl("-n", ns, "get", "pod", name, "-o", "jsonpath={.status.phase}")

        _wait("the 8-GPU pod to run on the kwok node", lambda: phase("all-eight") == "Running")
        # The node is full now: one more GPU must not fit, and the scheduler must say so.
        control_plane.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(_pod("one-more", target, 1)))

        def unschedulable():
            pod = json.loads(control_plane.kubectl("-n", ns, "get", "pod", "one-more", "-o", "json"))
            conds = pod["status"].get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conds) and pod

        pod = _wait("the scheduler to refuse a ninth GPU", unschedulable)
        assert "nvidia.com/gpu" in json.dumps(pod["status"]["conditions"])
    finally:
        control_plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for n in nodes:
            control_plane.kubectl("delete", "node", n.name, "--ignore-not-found", check=False)
