"""Kubelet nodes on this one machine, each with its own containerd.

Two kubelets can share a host when nothing of theirs overlaps: each node has its own
containerd (socket, root, state, CRI streaming port and CNI config), its own kubelet root
directory, ports, serving certificate and `--hostname-override`, and its own slice of the pod
range on the shared bridge. Each kubelet's pod cgroups sit under its own `cgroupRoot`
(tests/cluster/cgroups.py), so the two never fight over one `/kubepods` hierarchy.

One path the kubelet does not derive from its root directory: the device-plugin registry
socket, `/var/lib/kubelet/device-plugins/kubelet.sock`, fixed in the kubelet's source. Each
kubelet empties that directory and then binds the socket, so two starting at once can race
(one binds between the other's cleanup and bind: "bind: address already in use", and the
kubelet exits). `start` therefore starts kubelets one at a time, each after the previous one has
bound its socket. The later kubelet's cleanup unlinks the earlier one's socket file; that costs
nothing here, since no device plugin registers (GPUs are patched in, below).

After a node registers, the harness patches `nvidia.com/gpu` into its status capacity and
allocatable (as Kueue's e2e tests do with kind). The kubelet leaves extended resources it does
not manage alone when it updates the node status, so the patch stays; `start` verifies it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from . import bins, cgroups, host, images, kubeconfig, network, pki, procs
from .api import ApiError, wait_for
from .controlplane import admin_client, save_credentials
from .layout import Layout, NodeSpec

REPO = Path(__file__).resolve().parents[2]
PAUSE_IMAGE = "localhost/rlkube/pause:dev"
# Fixed in the kubelet (pluginapi.KubeletSocket), shared by every kubelet on the host.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def socket(layout: Layout, node: NodeSpec) -> Path:
    return layout.node_dir(node) / "containerd.sock"


def containerd_name(node: NodeSpec) -> str:
    return f"containerd-{node.name}"


def kubelet_name(node: NodeSpec) -> str:
    return f"kubelet-{node.name}"


def _containerd_config(layout: Layout, node: NodeSpec) -> str:
    nd = layout.node_dir(node)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{layout.node_cache(node)}/containerd-root"
state = "{nd}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket(layout, node)}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{nd}/containerd/opt"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "{node.stream_port}"
  enable_selinux = false
  # This machine's root lacks CAP_SYS_RESOURCE, so no process may lower its OOM score below
  # containerd's; the CRI plugin then clamps the kubelet's -998/-997 instead of runc failing
  # with "failed to update /proc/self/oom_score_adj: Permission denied".
  restrict_oom_score_adj = true
  # Pod network namespaces under the state dir, so teardown finds (and unmounts) exactly ours.
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's own state per node (default /run/containerd/runc is shared by every containerd).
        Root = "{nd}/runc"
  [{cri}.cni]
    bin_dir = "{host.cni_bin_dir()}"
    conf_dir = "{nd}/cni/net.d"
    max_conf_num = 1
"""


def _cni_config(layout: Layout, node: NodeSpec) -> dict:
    start, end = node.pod_range
    return {
        "cniVersion": "0.4.0",
        "name": f"rlkube-{node.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": layout.bridge,
                # The harness owns the bridge address; a gateway bridge would also switch on the
                # host's IP forwarding, which would let pod traffic leave the machine.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.node_dir(node) / "cni" / "ipam"),
                    "ranges": [[{"subnet": layout.pod_network, "rangeStart": start, "rangeEnd": end,
                                 "gateway": layout.bridge_ip}]],  # fmt: skip
                    # Only the Service range (for the apiserver relay); no default route.
                    "routes": [{"dst": layout.service_cidr, "gw": layout.bridge_ip}],
                },
            }
        ],
    }


def _kubelet_config(layout: Layout, node: NodeSpec, crt: Path, key: Path) -> dict:
    nd = layout.node_dir(node)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": layout.bridge_ip,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        # Only the apiserver (system:masters client cert, checked above) can reach this port.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(crt),
        "tlsPrivateKeyFile": str(key),
        "containerRuntimeEndpoint": f"unix://{socket(layout, node)}",
        "cgroupDriver": "cgroupfs",
        # Each kubelet keeps its pods (kubepods/<qos>/pod<uid>/<container>) under its own
        # cgroup, so the two never share one /kubepods and teardown can kill a node's
        # containers by cgroup.
        "cgroupsPerQOS": True,
        "cgroupRoot": cgroups.create(layout, node),
        "enforceNodeAllocatable": ["pods"],
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [layout.bridge_ip],
        "clusterDomain": layout.cluster_domain,
        "resolvConf": str(nd / "resolv.conf"),
        "makeIPTablesUtilChains": False,
        "volumePluginDir": str(nd / "volume-plugins"),
        # Per node: a kubelet's log GC removes pod log folders of pods it does not know, which on a
        # shared /var/log/pods would be the other node's.
        "podLogsDir": str(nd / "pod-logs"),
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "nodeStatusUpdateFrequency": "10s",
        # Report every 10 s even without changes, so a test can see a status update happen.
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "maxPods": 60,
        "podPidsLimit": -1,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def prepare(layout: Layout, node: NodeSpec) -> None:
    nd = layout.node_dir(node)
    for d in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pki", "volume-plugins", "pod-logs"):
        (nd / d).mkdir(parents=True, exist_ok=True)
    (nd / "containerd.toml").write_text(_containerd_config(layout, node))
    (nd / "cni/net.d/10-rlkube.conflist").write_text(json.dumps(_cni_config(layout, node), indent=2))
    # An empty base resolv.conf: pods get only the cluster DNS and its search path, nothing of the host's.
    (nd / "resolv.conf").write_text("")
    crt, key = pki.issue(layout.pki, pki.Identity(f"kubelet-{node.name}", f"system:node:{node.name}", "system:nodes"))
    kubeconfig.write(nd / "kubelet.kubeconfig", server=layout.server, ca=layout.pki / "ca.crt", cert=crt, key=key,
                     user=f"system:node:{node.name}")  # fmt: skip
    serving = pki.issue(layout.pki, pki.Identity(f"kubelet-serving-{node.name}", node.name,
                                                 hosts=(layout.bridge_ip, node.name)))  # fmt: skip
    (nd / "kubelet.json").write_text(json.dumps(_kubelet_config(layout, node, *serving), indent=2))
    save_credentials(layout)


def start_containerd(layout: Layout, node: NodeSpec) -> None:
    procs.start(layout.state, containerd_name(node),
                ["containerd", "--config", str(layout.node_dir(node) / "containerd.toml")])  # fmt: skip


def ctr(layout: Layout, node: NodeSpec, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ctr", "--address", str(socket(layout, node)), "--namespace", "k8s.io", *args],
                          capture_output=True, text=True, check=check)  # fmt: skip


def start_kubelet(layout: Layout, node: NodeSpec) -> None:
    nd = layout.node_dir(node)
    labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
    procs.start(
        layout.state,
        kubelet_name(node),
        [
            str(bins.path("kubelet")),
            f"--config={nd / 'kubelet.json'}",
            f"--kubeconfig={nd / 'kubelet.kubeconfig'}",
            f"--root-dir={nd / 'kubelet'}",
            f"--cert-dir={nd / 'pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={layout.bridge_ip}",
            f"--node-labels={labels}",
            "--v=1",
        ],
    )  # fmt: skip


def _socket_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime) of the socket at `path`, None when absent: a new bind changes it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_ctime_ns)


def _node_ready(obj: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def patch_gpus(layout: Layout, node: NodeSpec) -> None:
    gpus = str(layout.gpus_per_node)
    admin_client(layout).patch(
        f"/api/v1/nodes/{node.name}/status",
        {"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}},
    )


def _start_network_services(layout: Layout) -> None:
    env = {"PYTHONPATH": str(REPO)}
    for name, module in (("cluster-dns", "tests.cluster.dns"), ("apiserver-relay", "tests.cluster.relay")):
        if not procs.running(layout.state, name):
            procs.start(layout.state, name, [sys.executable, "-m", module, "--state", str(layout.state)], env=env)


def start(layout: Layout, nodes: list[NodeSpec], timeout: float = 240.0) -> None:
    """Start containerd and a kubelet per node; wait until every node is Ready with its GPUs."""
    host.ensure(host.NODES, cni=True)
    bins.path("kubelet")
    network.bridge_up(layout)
    _start_network_services(layout)
    for node in nodes:
        prepare(layout, node)
        start_containerd(layout, node)
    for node in nodes:
        wait_for(f"containerd of {node.name}",
                 lambda n=node: procs.running(layout.state, containerd_name(n)) and ctr(layout, n, "version").returncode == 0,
                 60, diagnose=lambda n=node: procs.log_tail(layout.state, containerd_name(n)))  # fmt: skip
    # The sandbox (pause) image must be in each containerd before the kubelet makes a pod.
    images.load(layout, nodes, images.build("pause"))
    for node in nodes:
        before = _socket_identity(DEVICE_PLUGIN_SOCKET)
        start_kubelet(layout, node)
        wait_for(f"kubelet of {node.name} to bind {DEVICE_PLUGIN_SOCKET}",
                 lambda n=node, b=before: procs.check_alive(layout.state, kubelet_name(n)) or _socket_identity(DEVICE_PLUGIN_SOCKET) not in (None, b),
                 60, diagnose=lambda n=node: procs.log_tail(layout.state, kubelet_name(n)))  # fmt: skip
    client = admin_client(layout)

    def ready(node: NodeSpec) -> bool:
        procs.check_alive(layout.state, kubelet_name(node))
        try:
            return _node_ready(client.get(f"/api/v1/nodes/{node.name}"))
        except ApiError as err:
            if err.status == 404:
                return False
            raise

    for node in nodes:
        wait_for(f"node {node.name} Ready", lambda n=node: ready(n), timeout,
                 diagnose=lambda n=node: procs.log_tail(layout.state, kubelet_name(n)))  # fmt: skip

    def gpus_stuck(node: NodeSpec) -> bool:
        patch_gpus(layout, node)
        # Stuck = still there after the kubelet's next status update (nodeStatusUpdateFrequency 10s
        # is too slow to wait for each time; one fresh read after a patch proves it was accepted).
        obj = client.get(f"/api/v1/nodes/{node.name}")
        return obj["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(layout.gpus_per_node)

    for node in nodes:
        wait_for(f"nvidia.com/gpu on {node.name}", lambda n=node: gpus_stuck(n), 30)


def stop_containers(layout: Layout) -> None:
    """Kill every task of every node's containerd that still answers (before containerd goes)."""
    for nd in sorted((layout.state / "nodes").glob("*")):
        sock = nd / "containerd.sock"
        if not sock.exists():
            continue
        base = ["ctr", "--address", str(sock), "--namespace", "k8s.io", "--timeout", "5s"]
        listed = subprocess.run([*base, "tasks", "ls", "-q"], capture_output=True, text=True)
        for task in listed.stdout.split():
            subprocess.run([*base, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
        for task in listed.stdout.split():
            subprocess.run([*base, "tasks", "delete", "-f", task], capture_output=True)
