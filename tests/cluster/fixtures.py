"""pytest fixtures for tests that need a real cluster: `control_plane`, `cluster` and `kueue`.

Both are session-scoped. Each reuses a cluster that is already up (its kubeconfig answers:
`make cluster-up`, or another test session on this machine) and otherwise starts one and tears
it down at the end of the session, unless another session still uses it. A cluster that cannot
start is a test error with the reason, never a skip; a developer without the harness can set
RLKUBE_SKIP_CLUSTER=1 to skip these tests on purpose. RLKUBE_KEEP_CLUSTER=1 keeps a cluster the
session started (faster reruns). `kueue` adds Kueue (tests/cluster/kueue.py) to the control plane
the same way: reused when it runs, stopped by the last session that uses it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from . import bins, images, kwok
from . import kueue as kueue_harness
from .api import Client
from .cluster import down, locked, logs_kept, up
from .controlplane import admin_client
from .layout import Layout, NodeSpec, default_nodes


@dataclass
class Cluster:
    """A running test cluster, as a test sees it."""

    layout: Layout
    mode: str
    nodes: list[NodeSpec] = field(default_factory=list)

    @property
    def kubeconfig(self) -> str:
        return str(self.layout.kubeconfig)

    @property
    def api(self) -> Client:
        """A stdlib client with admin credentials (for quick checks without the kubernetes package)."""
        return admin_client(self.layout)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        """Run the harness's kubectl against this cluster; returns stdout, raises with stderr on failure."""
        proc = subprocess.run(
            [str(bins.kubectl()), f"--kubeconfig={self.kubeconfig}", *args],
            input=input, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def add_kwok_nodes(self, nodes: list[kwok.FakeNode], timeout: float = 120.0) -> list[str]:
        """Create Ready fake nodes (kwok) with the given labels and GPUs; returns their names.

        They carry the taint `kwok.x-k8s.io/node=fake:NoSchedule` and the label `type=kwok`;
        `delete_kwok_nodes` removes them all.
        """
        kwok.add_nodes(self.layout, nodes, timeout)
        return [n.name for n in nodes]

    def delete_kwok_nodes(self) -> None:
        kwok.delete_nodes(self.layout)

    def load_image(self, ref: str) -> str:
        """Build `images/<name>` (cached by input hash) and load it into every node; returns the ref."""
        if not self.nodes:
            raise RuntimeError("load_image needs the `cluster` fixture (kubelet nodes), not `control_plane`")
        archive = images.build(images.name_of(ref))
        images.load(self.layout, self.nodes, archive)  # `kind load` on a kind cluster
        return archive.ref


def _users(layout: Layout, of: str = "users") -> Path:
    return layout.state / of


def _live_users(layout: Layout, of: str = "users") -> list[int]:
    live = []
    for f in _users(layout, of).glob("*") if _users(layout, of).exists() else []:
        pid = int(f.name)
        if Path(f"/proc/{pid}").exists():
            live.append(pid)
        else:
            f.unlink(missing_ok=True)
    return live


def _session_cluster(mode: str):
    if os.environ.get("RLKUBE_SKIP_CLUSTER") == "1":
        pytest.skip("RLKUBE_SKIP_CLUSTER=1: tests needing a real cluster are skipped on purpose")
    layout = Layout()
    with locked(layout):
        try:
            # up() returns no timings when a matching cluster was already up: then it is not ours.
            started = bool(up(layout, mode))
        except Exception as err:
            raise RuntimeError(
                f"the test cluster ({mode}) could not start: {err}\n"
                f"logs: {logs_kept(layout)} (or {layout.state / 'logs'} with RLKUBE_KEEP_CLUSTER=1); "
                "set RLKUBE_SKIP_CLUSTER=1 to skip cluster tests on purpose"
            ) from err
        _users(layout).mkdir(parents=True, exist_ok=True)
        (_users(layout) / str(os.getpid())).touch()
    try:
        yield Cluster(layout, mode, default_nodes() if mode == "full" else [])
    finally:
        with locked(layout):
            (_users(layout) / str(os.getpid())).unlink(missing_ok=True)
            if started and not _live_users(layout) and os.environ.get("RLKUBE_KEEP_CLUSTER") != "1":
                down(layout)


@pytest.fixture(scope="session")
def control_plane():
    """A real API server (etcd, apiserver, controller-manager, scheduler); no nodes."""
    yield from _session_cluster("control-plane")


@pytest.fixture(scope="session")
def cluster():
    """Control plane plus >= 2 Ready kubelet nodes with labels, fake GPUs and cluster DNS."""
    yield from _session_cluster("full")


@pytest.fixture(scope="session")
def kueue(control_plane):
    """Kueue (CRDs, webhooks, manager) running against the control plane; yields that cluster."""
    layout, users = control_plane.layout, "kueue-users"
    with locked(layout):
        try:
            kueue_harness.start(layout)
        except Exception as err:
            raise RuntimeError(
                f"Kueue could not start: {err}\nits log: {layout.state / 'logs' / 'kueue.log'}"
            ) from err
        _users(layout, users).mkdir(parents=True, exist_ok=True)
        (_users(layout, users) / str(os.getpid())).touch()
    try:
        yield control_plane
    finally:
        with locked(layout):
            (_users(layout, users) / str(os.getpid())).unlink(missing_ok=True)
            # Whoever started it, the last session using Kueue stops it (and unregisters its
            # webhooks), so a kept cluster is never left with webhooks nobody serves.
            if not _live_users(layout, users) and os.environ.get("RLKUBE_KEEP_CLUSTER") != "1":
                kueue_harness.stop(layout)
