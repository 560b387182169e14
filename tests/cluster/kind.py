"""The same test cluster on kind: `RLKUBE_CLUSTER=kind make cluster-up|demo|e2e`.

A kind cluster named `rlkube`: one control-plane node and two workers named as the harness's
nodes (`rlk-node-0`, `rlk-node-1`, set through kubeadm's nodeRegistration.name) with the same
labels and the same fake `nvidia.com/gpu: 2`, so the e2e suite runs unchanged against it. State
and the admin kubeconfig are in /tmp/rlkube-kind (RLKUBE_CLUSTER_DIR), apart from the harness's
/tmp/rlkube-cluster, so both paths can be used on one machine.

Where it runs:
- the Docker engine: one that answers already, else the project's own (docker_engine.py: Debian's
  dockerd with no iptables rules and the host's FORWARD policy untouched);
- kind: built from its Go module (kind-bins.sh);
- the node image: built here with no registry (kindnode.py) unless RLKUBE_KIND_IMAGE names one
  (e.g. a `kindest/node` image on a machine that reaches public registries; then kind's default
  CNI, kindnetd, is used as it is).

With the local node image there is no kindnetd: the cluster is created with `disableDefaultCNI`
and `setup_network` gives each node a CNI config (ptp + host-local over the node's podCIDR) and
routes to the other nodes' podCIDRs, inside the nodes' own network namespaces. Pod traffic
between nodes stays on the kind Docker bridge (layer 2), so the host forwards nothing.

`RLKUBE_CLUSTER=native` forces the harness; unset, kind is used only where a `kind` command and a
Docker engine on the default socket already exist (a developer's laptop), never on CI machines.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from . import bins, docker_engine, procs
from .layout import Layout, NodeSpec, default_nodes

NAME = "rlkube"
HERE = Path(__file__).resolve().parent
POD_SUBNET = "10.244.0.0/16"
# Folders every worker sees as one, as the harness's nodes share the machine's disk: the
# operator's hostPath checkpoint root (hostPathShared) and the e2e's shared PersistentVolumes.
SHARED_PATHS = ("/var/lib/rlkube", "/var/lib/rlkube-e2e-pv")
# The examples' data, which jobs mount by hostPath at this checkout's path (examples/dpo-chat-cpu.yaml).
EXAMPLE_DATA = str(HERE.parents[1] / "examples" / "data")


def selected() -> bool:
    """Whether the test cluster is a kind cluster (RLKUBE_CLUSTER, see the module docstring)."""
    choice = os.environ.get("RLKUBE_CLUSTER") or os.environ.get("RLKUBE_CLUSTER_BACKEND", "auto")
    if choice not in ("auto", "native", "kind"):
        raise ValueError(f"RLKUBE_CLUSTER must be kind, native or auto, got {choice!r}")
    if choice != "auto":
        return choice == "kind"
    if shutil.which("kind") is None or shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


def kind_binary() -> Path:
    subprocess.run([str(HERE / "kind-bins.sh"), "kind"], check=True, capture_output=True)
    return next((bins.cache_root()).glob("kind-v*/kind"))


def _kind(*args: str, env: dict[str, str], timeout: float = 600, check: bool = True) -> str:
    proc = subprocess.run(
        [str(kind_binary()), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"kind {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def _docker(*args: str, env: dict[str, str], input: str | None = None, check: bool = True) -> str:
    proc = subprocess.run([docker_engine.docker_cli(), *args], env=env, input=input, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def api_port(layout: Layout) -> int:
    """The API server's published port on 127.0.0.1 (apart from the harness's 6443)."""
    return 7443 + 100 * layout.index


def node_image(env: dict[str, str]) -> tuple[str, bool]:
    """(image, local): RLKUBE_KIND_IMAGE, else the locally built node image loaded into the engine."""
    if os.environ.get("RLKUBE_KIND_IMAGE"):
        return os.environ["RLKUBE_KIND_IMAGE"], False
    from . import kindnode

    ref, archive = kindnode.build()
    kindnode.load(ref, archive, env)
    return ref, True


def config(layout: Layout, nodes: list[NodeSpec], local_image: bool) -> str:
    """kind's cluster config: workers named and labelled as the harness's nodes."""
    cfg: dict = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": NAME,
        "networking": {
            "apiServerAddress": "127.0.0.1",
            "apiServerPort": api_port(layout),
            "podSubnet": POD_SUBNET,
            "disableDefaultCNI": local_image,
        },  # fmt: skip
        "nodes": [{"role": "control-plane"}],
        # As the harness's kubelets (nodes.py): node status every 10 s, not kubeadm's 5 min, so a
        # patched extended resource is seen surviving the kubelet's status updates.
        "kubeadmConfigPatches": ["kind: KubeletConfiguration\nnodeStatusUpdateFrequency: 10s\n"
                                 "nodeStatusReportFrequency: 10s\n"],
    }
    for node in nodes:
        patch = f"kind: JoinConfiguration\nnodeRegistration:\n  name: {node.name}\n"
        cfg["nodes"].append({"role": "worker", "labels": dict(node.labels), "kubeadmConfigPatches": [patch],
                             "extraMounts": [*({"hostPath": p, "containerPath": p} for p in SHARED_PATHS),
                                             {"hostPath": EXAMPLE_DATA, "containerPath": EXAMPLE_DATA, "readOnly": True}]})  # fmt: skip
    return json.dumps(cfg, indent=1)  # JSON is YAML


def _write_credentials(layout: Layout, kubeconfig: dict) -> None:
    """The admin kubeconfig as JSON, and its certificates as files for the stdlib client (api.py)."""
    layout.kubeconfig.write_text(json.dumps(kubeconfig, indent=1))
    layout.pki.mkdir(parents=True, exist_ok=True)
    cluster, user = kubeconfig["clusters"][0]["cluster"], kubeconfig["users"][0]["user"]
    for name, data in (("ca.crt", cluster["certificate-authority-data"]), ("admin.crt", user["client-certificate-data"]),
                       ("admin.key", user["client-key-data"])):  # fmt: skip
        (layout.pki / name).write_bytes(base64.b64decode(data))
    (layout.state / "server").write_text(cluster["server"] + "\n")


def kubectl(layout: Layout, *args: str, input: str | None = None) -> str:
    proc = subprocess.run([str(bins.kubectl()), f"--kubeconfig={layout.kubeconfig}", *args], input=input,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args[:4])} failed: {proc.stderr.strip()}")
    return proc.stdout


def containers(env: dict[str, str]) -> dict[str, str]:
    """The cluster's node containers: IP address on the kind network -> container name."""
    names = _docker("ps", "-q", "--filter", f"label=io.x-k8s.kind.cluster={NAME}", env=env).split()
    out = {}
    for cid in names:
        info = json.loads(_docker("inspect", cid, env=env))[0]
        for net in info["NetworkSettings"]["Networks"].values():
            if net.get("IPAddress"):
                out[net["IPAddress"]] = info["Name"].lstrip("/")
    return out


def setup_network(layout: Layout, env: dict[str, str]) -> None:
    """Each node's CNI config over its podCIDR, and routes to the other nodes' pods (no kindnetd)."""
    by_ip = containers(env)
    nodes = []
    for item in json.loads(kubectl(layout, "get", "nodes", "-o", "json"))["items"]:
        ip = next(a["address"] for a in item["status"]["addresses"] if a["type"] == "InternalIP")
        if not item["spec"].get("podCIDR"):
            raise RuntimeError(f"node {item['metadata']['name']} has no spec.podCIDR (allocate-node-cidrs?)")
        nodes.append((by_ip[ip], ip, item["spec"]["podCIDR"]))
    for container, _, cidr in nodes:
        conflist = {
            "cniVersion": "0.4.0",
            "name": "rlkube",
            "plugins": [
                {"type": "ptp", "ipMasq": False, "mtu": 1500,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }  # fmt: skip
        routes = "".join(f"ip route replace {c} via {ip}\n" for other, ip, c in nodes if other != container)
        script = (
            "set -e\nsysctl -qw net.ipv4.ip_forward=1\nmkdir -p /etc/cni/net.d\n"
            f"cat > /etc/cni/net.d/10-rlkube.conflist <<'EOF'\n{json.dumps(conflist, indent=1)}\nEOF\n{routes}"
        )
        _docker("exec", "-i", container, "sh", "-s", env=env, input=script)


def wait_nodes_ready(layout: Layout, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        items = json.loads(kubectl(layout, "get", "nodes", "-o", "json"))["items"]
        ready = [
            n
            for n in items
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        ]
        if len(ready) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"kind: {len(ready)}/{count} nodes Ready after {timeout:.0f} s")
        time.sleep(1)


def up(layout: Layout, timeout: float = 300.0) -> dict[str, float]:
    """Create (or adopt) the kind cluster; returns the seconds each stage took."""
    t0 = time.monotonic()
    times: dict[str, float] = {}
    layout.state.mkdir(parents=True, exist_ok=True)
    (layout.state / "backend").write_text("kind\n")  # first: a failed start is still torn down as kind
    env = docker_engine.up()
    times["engine_s"] = round(time.monotonic() - t0, 1)
    image, local = node_image(env)
    times["node_image_s"] = round(time.monotonic() - t0 - times["engine_s"], 1)
    nodes = default_nodes()
    for p in SHARED_PATHS:
        Path(p).mkdir(parents=True, exist_ok=True)
    (layout.state / "kind.yaml").write_text(config(layout, nodes, local))
    t1 = time.monotonic()
    if NAME not in _kind("get", "clusters", env=env).split():
        _kind("create", "cluster", "--name", NAME, "--image", image, "--config", str(layout.state / "kind.yaml"),
              "--kubeconfig", str(layout.state / "kind-kubeconfig"), "--retain", env=env, timeout=timeout + 120)  # fmt: skip
    raw = _kind("get", "kubeconfig", "--name", NAME, env=env)
    kc = subprocess.run([str(bins.kubectl()), "config", "view", "--raw", "--flatten", "-o", "json"],
                        env={**env, "KUBECONFIG": "/dev/stdin"}, input=raw, capture_output=True, text=True, check=True)  # fmt: skip
    _write_credentials(layout, json.loads(kc.stdout))
    # kind's CA key, so the harness's pki.issue can sign serving certificates the API server
    # trusts (Kueue's webhooks, tests/cluster/kueue.py), as it does with the harness's own CA.
    (layout.pki / "ca.key").write_text(_docker("exec", f"{NAME}-control-plane", "cat", "/etc/kubernetes/pki/ca.key",
                                               env=env))  # fmt: skip
    (layout.pki / "ca.key").chmod(0o600)
    if local:
        setup_network(layout, env)
    wait_nodes_ready(layout, len(nodes) + 1, timeout)
    times["create_s"] = round(time.monotonic() - t1, 1)
    gpus = str(layout.gpus_per_node)
    patch = json.dumps(
        {"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}}
    )
    for node in nodes:
        kubectl(layout, "patch", "node", node.name, "--subresource=status", "--type=merge", "-p", patch)
    (layout.state / "mode").write_text("full\n")
    times["total_s"] = round(time.monotonic() - t0, 1)
    return times


def down(layout: Layout) -> None:
    """Stop the host processes the tests started for this cluster (Kueue's manager), delete the
    kind cluster (the engine stays: `make cluster-down` also stops it)."""
    procs.stop_all(layout.state)
    env = docker_engine.env()
    if docker_engine.ours_running() or subprocess.run([docker_engine.docker_cli(), "info"], env=env,
                                                      capture_output=True).returncode == 0:  # fmt: skip
        _kind("delete", "cluster", "--name", NAME, env=env, check=False)
    shutil.rmtree(layout.state, ignore_errors=True)


def load_image(layout: Layout, image) -> None:
    """`kind load image-archive` of an images.ImageArchive into the workers (pods run there
    only), unless they have it already (a marker per node in the cluster's state); then drop the
    layer blobs the import leaves next to the unpacked snapshots (as images.load does on the harness).

    One worker at a time, each one's blobs dropped before the next import: an import holds the
    image twice in its node (the layer blobs, uncompressed in a docker-archive, and the unpacked
    snapshots) until the blobs go, so kind's default of importing into every node at once needs
    that twice over at its peak (runtime-cpu, 4.8 GB, took the engine's data root past 22 GB).
    """
    env = docker_engine.env()
    by_node = {name: container for container, name in _node_containers(layout, env).items()}
    marker = {
        w.name: layout.state / "images" / f"{w.name}-{image.ref.replace('/', '_')}" for w in default_nodes()
    }
    for w, m in marker.items():
        if m.exists() and m.read_text() == image.input_hash:
            continue
        _kind("load", "image-archive", str(image.path), "--name", NAME, "--nodes", by_node[w], env=env)
        _drop_layer_blobs(by_node[w], image.ref, env)
        m.parent.mkdir(parents=True, exist_ok=True)
        m.write_text(image.input_hash)


def _node_containers(layout: Layout, env: dict[str, str]) -> dict[str, str]:
    """container name -> Kubernetes node name."""
    by_ip = containers(env)
    out = {}
    for item in json.loads(kubectl(layout, "get", "nodes", "-o", "json"))["items"]:
        ip = next(a["address"] for a in item["status"]["addresses"] if a["type"] == "InternalIP")
        out[by_ip[ip]] = item["metadata"]["name"]
    return out


def _drop_layer_blobs(container: str, ref: str, env: dict[str, str]) -> None:
    ctr = ["exec", container, "ctr", "-n", "k8s.io"]
    listing = _docker(*ctr, "images", "ls", env=env, check=False).splitlines()
    digest = next((line.split()[2] for line in listing[1:] if line.split() and line.split()[0] == ref), None)
    if digest is None:
        return
    manifest = json.loads(_docker(*ctr, "content", "get", digest, env=env))
    for layer in manifest.get("layers", []):
        _docker(*ctr, "content", "rm", layer["digest"], env=env, check=False)


def node_exec(layout: Layout, node_name: str, *cmd: str) -> str:
    """Run a command inside a kind node's container (e.g. `ctr -n k8s.io ...`); returns stdout."""
    env = docker_engine.env()
    by_node = {name: container for container, name in _node_containers(layout, env).items()}
    return _docker("exec", by_node[node_name], *cmd, env=env)


def is_kind(layout: Layout) -> bool:
    backend = layout.state / "backend"
    return backend.exists() and backend.read_text().strip() == "kind"


def host_address(layout: Layout) -> str:
    """The address at which the cluster's API server reaches a process on this machine (a webhook
    server): 127.0.0.1 on the harness, whose API server is a host process; on kind, the kind
    Docker network's gateway, the host's own address on that bridge (the API server runs in the
    control-plane container, where 127.0.0.1 is the container itself). The engine adds no
    iptables rules, so nothing filters the container-to-host traffic."""
    if not is_kind(layout):
        return "127.0.0.1"
    route = _docker("exec", f"{NAME}-control-plane", "ip", "-4", "route", "show", "default", env=docker_engine.env())
    words = route.split()  # "default via 172.18.0.1 dev eth0"
    if "via" not in words:
        raise RuntimeError(f"kind: no default route in the control-plane node: {route!r}")
    return words[words.index("via") + 1]


def node_pid(layout: Layout, node_name: str) -> int:
    """The host pid of a node container's init (systemd): its /proc/<pid>/root is the node's disk."""
    env = docker_engine.env()
    by_node = {name: container for container, name in _node_containers(layout, env).items()}
    return int(_docker("inspect", "-f", "{{.State.Pid}}", by_node[node_name], env=env).strip())


def kubelet_pid(layout: Layout, node_name: str) -> int:
    """The host pid of the kubelet inside a node container (the one process named kubelet in the
    node's pid namespace), so a test can signal it as it signals a harness kubelet."""
    init = node_pid(layout, node_name)
    namespace = os.readlink(f"/proc/{init}/ns/pid")
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "kubelet" \
                    and os.readlink(entry / "ns" / "pid") == namespace:  # fmt: skip
                found.append(int(entry.name))
        except OSError:
            continue
    if len(found) != 1:
        raise RuntimeError(f"kind: expected one kubelet in node {node_name}, found pids {found}")
    return found[0]


def pod_logs_dir(layout: Layout, node_name: str) -> Path:
    """A node's /var/log/pods as seen from the host (through its init's root), readable while
    the node's kubelet is stopped."""
    return Path(f"/proc/{node_pid(layout, node_name)}/root/var/log/pods")
