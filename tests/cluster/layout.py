"""Where the test cluster lives: its state directory, ports and address ranges.

All of it is private to this machine. Pods sit on one bridge the harness creates
(`rlkbr0`, 10.217.0.0/16, each node handing out its own /24 slice of it), with no default route,
so a pod can reach other pods, the host's DNS server and the `kubernetes` Service address, and
nothing else. Service ClusterIPs come from 10.218.0.0/24, which routes nowhere: there is no
kube-proxy; pods find each other through headless-Service DNS names, and the one ClusterIP that
matters, the apiserver's 10.218.0.1:443, is relayed by the harness's DNS process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _default_state() -> Path:
    return Path(os.environ.get("RLKUBE_CLUSTER_DIR", "/tmp/rlkube-cluster"))


@dataclass(frozen=True)
class NodeSpec:
    """One kubelet node: its name, index (ports and pod range derive from it) and labels."""

    name: str
    index: int
    labels: dict[str, str]

    @property
    def pod_range(self) -> tuple[str, str]:
        return (f"10.217.{self.index + 1}.2", f"10.217.{self.index + 1}.254")

    @property
    def pod_cidr(self) -> str:
        return f"10.217.{self.index + 1}.0/24"

    @property
    def kubelet_port(self) -> int:
        return 11250 + self.index

    @property
    def stream_port(self) -> int:
        return 11010 + self.index


def default_nodes(count: int = 2, gpus: int = 2) -> list[NodeSpec]:
    """Two nodes in one zone, each its own rack and NVLink clique (like one NVL domain per node)."""
    del gpus  # capacity is set by the cluster (GPUS_PER_NODE); kept for symmetry of callers
    return [
        NodeSpec(
            name=f"rlk-node-{i}",
            index=i,
            labels={
                "nvidia.com/gpu.clique": f"clique-{i}",
                "topology.kubernetes.io/zone": "zone-a",
                "rlkube.io/rack": f"rack-{i}",
                "nvidia.com/gpu.present": "true",
            },
        )
        for i in range(count)
    ]


@dataclass(frozen=True)
class Layout:
    state: Path = field(default_factory=_default_state)
    etcd_client_port: int = 23790
    etcd_peer_port: int = 23800
    apiserver_port: int = 6443
    controller_manager_port: int = 10357
    scheduler_port: int = 10359
    service_cidr: str = "10.218.0.0/24"
    kubernetes_service_ip: str = "10.218.0.1"
    pod_network: str = "10.217.0.0/16"
    bridge: str = "rlkbr0"
    bridge_ip: str = "10.217.0.1"  # the host on the pod bridge: node IP, DNS server, API relay
    cluster_domain: str = "cluster.local"
    gpus_per_node: int = 2

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def node_dir(self, node: NodeSpec) -> Path:
        return self.state / "nodes" / node.name

    def node_cache(self, node: NodeSpec) -> Path:
        """What a node keeps between clusters: its containerd root (content store, unpacked
        images), so warm starts do not re-import images. Under ~/.cache/rlkube/nodes/."""
        root = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
        return root / "nodes" / node.name
