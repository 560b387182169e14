"""The same test cluster on kind, where a Docker engine and the `kind` command exist.

`make cluster-up` prefers this path on such machines (RLKUBE_CLUSTER_BACKEND=native forces the
harness's own cluster, =kind forces this one): a kind cluster named `rlkube` with one
control-plane node and two workers carrying the same names' labels (`nvidia.com/gpu.clique`,
`topology.kubernetes.io/zone`, `rlkube.io/rack`) and the same fake `nvidia.com/gpu: 2`, the
admin kubeconfig at the same path, CoreDNS from kind, images loaded with `kind load
image-archive` from the same buildah archives. Control-plane mode is the same cluster (kind has
no node-less mode).

Not exercised on this project's machines (no Docker engine there); kept small so that what it
does can be read at a glance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from . import bins
from .layout import Layout, NodeSpec, default_nodes

NAME = "rlkube"


def available() -> bool:
    backend = os.environ.get("RLKUBE_CLUSTER_BACKEND", "auto")
    if backend == "native":
        return False
    have = shutil.which("kind") is not None and shutil.which("docker") is not None
    engine = have and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    if backend == "kind" and not engine:
        raise RuntimeError("RLKUBE_CLUSTER_BACKEND=kind, but `kind` or a working Docker engine is missing")
    return engine


def _config(nodes: list[NodeSpec]) -> str:
    lines = ["kind: Cluster", "apiVersion: kind.x-k8s.io/v1alpha4", "nodes:", "- role: control-plane"]
    for node in nodes:
        lines.append("- role: worker")
        lines.append("  labels:")
        lines.extend(f"    {k}: {json.dumps(v)}" for k, v in sorted(node.labels.items()))
    return "\n".join(lines) + "\n"


def up(layout: Layout, timeout: float = 300.0) -> None:
    layout.state.mkdir(parents=True, exist_ok=True)
    nodes = default_nodes()
    (layout.state / "kind.yaml").write_text(_config(nodes))
    clusters = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True).stdout.split()
    if NAME not in clusters:
        subprocess.run(["kind", "create", "cluster", "--name", NAME, "--config", str(layout.state / "kind.yaml"),
                        "--kubeconfig", str(layout.kubeconfig), f"--wait={int(timeout)}s"], check=True)  # fmt: skip
    else:
        kc = subprocess.run(["kind", "get", "kubeconfig", "--name", NAME], capture_output=True, text=True, check=True)
        layout.kubeconfig.write_text(kc.stdout)
    kubectl = [str(bins.kubectl()), f"--kubeconfig={layout.kubeconfig}"]
    workers = subprocess.run([*kubectl, "get", "nodes", "-l", "!node-role.kubernetes.io/control-plane", "-o", "name"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    gpus = str(layout.gpus_per_node)
    patch = json.dumps({"status": {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}})
    for worker in workers:
        subprocess.run([*kubectl, "patch", worker, "--subresource=status", "--type=merge", "-p", patch], check=True)
    (layout.state / "mode").write_text("full\n")
    (layout.state / "backend").write_text("kind\n")


def down(layout: Layout) -> None:
    subprocess.run(["kind", "delete", "cluster", "--name", NAME], capture_output=True)
    shutil.rmtree(layout.state, ignore_errors=True)


def load_image(archive_path: str) -> None:
    subprocess.run(["kind", "load", "image-archive", archive_path, "--name", NAME], check=True)
