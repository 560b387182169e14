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
    if "RLKUBE_CLUSTER_DIR" in os.environ:
        return Path(os.environ["RLKUBE_CLUSTER_DIR"])
    return kind_state() if os.environ.get("RLKUBE_CLUSTER") == "kind" else Path("/tmp/rlkube-cluster")


def kind_state() -> Path:
    """The kind path's state (tests/cluster/kind.py), apart from the harness's cluster."""
    return Path("/tmp/rlkube-kind")


def cluster_index() -> int:
    """RLKUBE_CLUSTER_INDEX=k shifts every port by 100*k and every address range, and renames the
    bridge, so a second cluster (an experiment, another checkout) can run next to the shared one;
    give it its own RLKUBE_CLUSTER_DIR too."""
    index = int(os.environ.get("RLKUBE_CLUSTER_INDEX", "0"))
    if not 0 <= index <= 3:
        raise ValueError(f"RLKUBE_CLUSTER_INDEX must be 0..3 (address ranges 10.217-10.248), got {index}")
    return index


@dataclass(frozen=True)
class NodeSpec:
    """One kubelet node: its name, index (ports and pod range derive from it) and labels."""

    name: str
    index: int
    labels: dict[str, str]
    cluster: int = field(default_factory=cluster_index)

    @property
    def pod_range(self) -> tuple[str, str]:
        net = 217 + 10 * self.cluster
        return (f"10.{net}.{self.index + 1}.2", f"10.{net}.{self.index + 1}.254")

    @property
    def kubelet_port(self) -> int:
        return 11250 + 100 * self.cluster + self.index

    @property
    def stream_port(self) -> int:
        return 11010 + 100 * self.cluster + self.index


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
    index: int = field(default_factory=cluster_index)
    cluster_domain: str = "cluster.local"
    gpus_per_node: int = 2

    # Ports on 127.0.0.1 (the kubelets' are on the bridge address).
    @property
    def etcd_client_port(self) -> int:
        return 23790 + 100 * self.index

    @property
    def etcd_peer_port(self) -> int:
        return 23800 + 100 * self.index

    @property
    def apiserver_port(self) -> int:
        return 6443 + 100 * self.index

    @property
    def controller_manager_port(self) -> int:
        return 10357 + 100 * self.index

    @property
    def scheduler_port(self) -> int:
        return 10359 + 100 * self.index

    # Address ranges: pods 10.217.0.0/16, Services 10.218.0.0/24 (shifted by 10 per index).
    @property
    def pod_network(self) -> str:
        return f"10.{217 + 10 * self.index}.0.0/16"

    @property
    def bridge_ip(self) -> str:
        """The host on the pod bridge: node IP of every kubelet, DNS server, API relay."""
        return f"10.{217 + 10 * self.index}.0.1"

    @property
    def service_cidr(self) -> str:
        return f"10.{218 + 10 * self.index}.0.0/24"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.{218 + 10 * self.index}.0.1"

    @property
    def bridge(self) -> str:
        return f"rlkbr{self.index}"

    @property
    def bridge_mac(self) -> str:
        """A fixed, locally administered MAC for the bridge (see network.bridge_up)."""
        return f"02:72:6c:6b:00:{self.index:02x}"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def pki_cache(self) -> Path:
        """Certificates kept between clusters (making them is ~10 s on a busy 2-core machine);
        copied into `pki` at start, so every process's command line still names the state dir."""
        root = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
        return root / f"pki-{self.index}"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def server(self) -> str:
        try:  # a kind cluster publishes its API server on a port of its own (kind.py)
            return (self.state / "server").read_text().strip()
        except OSError:
            return f"https://127.0.0.1:{self.apiserver_port}"

    def node_dir(self, node: NodeSpec) -> Path:
        return self.state / "nodes" / node.name

    def node_cache(self, node: NodeSpec) -> Path:
        """What a node keeps between clusters: its containerd root (content store, unpacked
        images), so warm starts do not re-import images. Under ~/.cache/rlkube/nodes/."""
        root = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
        # Per cluster index: two containerds must never open one root (its bolt database).
        return root / f"nodes-{self.index}" / node.name
