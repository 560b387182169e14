"""Fake nodes at scale with kwok: Node objects that look Ready and "run" pods without kubelets.

kwok (built from sigs.k8s.io/kwok) runs as one controller process against the test apiserver and
keeps every node annotated `kwok.x-k8s.io/node=fake` alive (heartbeats, Ready condition) and
moves pods bound to them to Running. Nodes are created by the harness with the GPU topology
labels and `nvidia.com/gpu` capacity a placement or scale test asks for, and a
`kwok.x-k8s.io/node=fake:NoSchedule` taint so that only pods which tolerate it (the tests' own)
land there. Works in either cluster mode; needs no containerd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import bins, procs
from .api import ApiError, wait_for
from .controlplane import admin_client
from .layout import Layout

KWOK = "kwok"
ANNOTATION = "kwok.x-k8s.io/node"
TAINT = {"key": ANNOTATION, "value": "fake", "effect": "NoSchedule"}
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"


@dataclass(frozen=True)
class FakeNode:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 8
    cpu: str = "64"
    memory: str = "512Gi"


def start(layout: Layout) -> None:
    """Start the kwok controller (once per cluster)."""
    if procs.running(layout.state, KWOK):
        return
    procs.start(
        layout.state,
        KWOK,
        [
            str(bins.kwok()),
            f"--kubeconfig={layout.kubeconfig}",
            f"--manage-nodes-with-annotation-selector={ANNOTATION}=fake",
            f"--config={STAGES}",
            # kwok's own pod IPs; nothing routes them, they only fill in pod status.
            "--cidr=10.219.0.0/16",
            "--node-ip=10.219.255.254",
        ],
    )  # fmt: skip


def _node(n: FakeNode) -> dict:
    resources = {"cpu": n.cpu, "memory": n.memory, "pods": "110", "nvidia.com/gpu": str(n.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n.name,
            "annotations": {ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "type": "kwok", **n.labels},
        },
        "spec": {"taints": [TAINT]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def add_nodes(layout: Layout, nodes: list[FakeNode], timeout: float = 120.0) -> None:
    """Create the fake nodes (replacing same-named ones) and wait until kwok reports them Ready."""
    start(layout)
    client = admin_client(layout)
    for n in nodes:
        try:
            client.delete(f"/api/v1/nodes/{n.name}")
        except ApiError as err:
            if err.status != 404:
                raise
        client.post("/api/v1/nodes", _node(n))
        # Status is a subresource: the create above drops it, so set capacity explicitly.
        client.patch(f"/api/v1/nodes/{n.name}/status", {"status": _node(n)["status"]})

    def all_ready() -> bool:
        procs.check_alive(layout.state, KWOK)
        items = client.get("/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
        ready = {
            i["metadata"]["name"]
            for i in items
            if any(c["type"] == "Ready" and c["status"] == "True" for c in i["status"].get("conditions", []))
        }
        return all(n.name in ready for n in nodes)

    wait_for(f"{len(nodes)} kwok nodes Ready", all_ready, timeout, interval=0.5,
             diagnose=lambda: procs.log_tail(layout.state, KWOK))  # fmt: skip


def delete_nodes(layout: Layout) -> None:
    """Delete every kwok node (pods on them are garbage-collected by the control plane)."""
    admin_client(layout).request("DELETE", "/api/v1/nodes?labelSelector=type%3Dkwok")
