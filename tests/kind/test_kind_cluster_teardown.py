"""A kind cluster made by the project, then `make cluster-down`: nothing of it is left (issue 19).

`RLKUBE_CLUSTER=kind` cluster up (the project's Docker engine, the locally built node image, kind
from its Go module): three nodes Ready, the workers named, labelled and given fake GPUs as the
harness's nodes, the host's FORWARD policy and ip_forward unchanged while it runs. Then `make
cluster-down` as a kind user runs it (RLKUBE_CLUSTER=kind, so a harness cluster is left alone): no
dockerd or containerd of the engine, no kind container, no network interface, mount or iptables
rule left, the firewall as recorded, the kind state gone.

Needs root and the cluster lock (`make kind-teardown-test`). About 2 minutes with the node image
built (the first run builds it: see docs/cluster.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cluster import docker_engine
from tests.cluster import kind as kind_cluster
from tests.cluster.cluster import up
from tests.cluster.layout import Layout, default_nodes, kind_state

REPO = Path(__file__).resolve().parents[2]


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [m.split()[1] for m in lines if m.split()[1].startswith(str(root))]


def test_kind_cluster_up_then_cluster_down_leaves_host_as_found(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd, iptables)")
    if docker_engine.ours_running() or kind_state().exists():
        pytest.fail("a project engine or kind cluster already runs: `make cluster-down` first")
    if "DOCKER_HOST" in os.environ or docker_engine._info_ok(dict(os.environ)):
        pytest.skip("another Docker engine runs here; the project would use it, not start its own")
    monkeypatch.setenv("RLKUBE_CLUSTER", "kind")
    before, links = docker_engine.firewall(), _links()
    layout = Layout()
    assert layout.state == kind_state()
    try:
        timings = up(layout, "full", timeout=300)
        print(f"kind cluster up: {timings}")
        nodes = json.loads(kind_cluster.kubectl(layout, "get", "nodes", "-o", "json"))["items"]
        by_name = {n["metadata"]["name"]: n for n in nodes}
        assert len(nodes) == 3, sorted(by_name)
        for spec in default_nodes():
            node = by_name[spec.name]
            for key, value in spec.labels.items():
                assert node["metadata"]["labels"].get(key) == value, (spec.name, key)
            assert node["status"]["allocatable"].get("nvidia.com/gpu") == str(layout.gpus_per_node)
        now = docker_engine.firewall()
        assert docker_engine.forward_policy(now) == docker_engine.forward_policy(before)
        assert now["ip_forward"] == before["ip_forward"]
    finally:
        # With RLKUBE_CLUSTER=kind (set above), as a kind user runs it: cluster-down then stops only
        # the kind cluster and the engine. Unset, it would also stop a harness cluster that another
        # engineer's session keeps up on this machine.
        down = subprocess.run(["make", "-s", "cluster-down"], cwd=REPO, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert down.returncode == 0, down.stdout + down.stderr
    assert "host firewall as found" in down.stdout, down.stdout
    assert docker_engine.compare(before, docker_engine.firewall()) == []
    assert not docker_engine.ours_running()
    assert not kind_state().exists()
    assert _links() - links == set(), f"interfaces left behind: {_links() - links}"
    assert _mounts_under(docker_engine.state_dir()) == []
    assert _mounts_under(docker_engine.data_root() / "overlay2") == []
    assert _mounts_under(docker_engine.data_root() / "volumes") == []
    left = subprocess.run(["pgrep", "-f", f"containerd.*{docker_engine.state_dir()}"], capture_output=True)
    assert left.returncode == 1, f"processes of the engine left: {left.stdout!r}"
    assert _in_docker_cgroups() == [], "processes of kind nodes (Docker containers) left"


def _in_docker_cgroups() -> list[int]:
    """Processes in a cgroup of a Docker container (dockerd puts each under /docker/<id>)."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and "/docker/" in (p / "cgroup").read_text():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids
