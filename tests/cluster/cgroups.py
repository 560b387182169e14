"""A cgroup per test node, so teardown can find and kill every container of that node.

Container processes live in their own mount namespace (their /proc/<pid>/root reads "/") and
outlive a killed shim, so neither their command line nor their root names the state dir. Their
cgroup does: each kubelet runs with `cgroupRoot: /<node cgroup>`, and with `cgroupsPerQOS: false`
that is the parent the kubelet gives containerd for every pod. The name carries a hash of the
state dir, so another copy of the harness on the same machine has different cgroups.
Works on cgroup v1 (one tree per controller, as on this project's machines) and v2.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

from .layout import Layout, NodeSpec

ROOT = Path("/sys/fs/cgroup")


def name(layout: Layout, node: NodeSpec) -> str:
    digest = hashlib.sha1(str(layout.state.resolve()).encode()).hexdigest()[:6]
    return f"rlkube-{digest}-{node.name}"


def hierarchies() -> list[Path]:
    """Mounted cgroup trees: every v1 controller tree, or the single v2 tree."""
    if (ROOT / "cgroup.controllers").exists():
        return [ROOT]
    return sorted(p for p in ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def create(layout: Layout, node: NodeSpec) -> str:
    """Create the node's cgroup in every tree; returns its path for the kubelet's cgroupRoot."""
    cg = name(layout, node)
    for tree in hierarchies():
        path = tree / cg
        path.mkdir(exist_ok=True)
        # A v1 cpuset cgroup takes no task until it has CPUs and memory nodes: inherit the parent's.
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists() and not (path / knob).read_text().strip():
                (path / knob).write_text((tree / knob).read_text())
    return "/" + cg


def _subtree(path: Path) -> list[Path]:
    return sorted((Path(d) for d, _, _ in os.walk(path)), key=lambda p: len(p.parts), reverse=True)


def pids(layout: Layout, node_names: list[str]) -> set[int]:
    found: set[int] = set()
    for tree in hierarchies():
        for n in node_names:
            path = tree / name(layout, NodeSpec(n, 0, {}))
            if path.exists():
                for d in _subtree(path):
                    try:
                        found |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
                    except OSError:
                        pass
    return found


def kill_and_remove(layout: Layout, node_names: list[str], timeout: float = 10.0) -> int:
    """SIGKILL every process in the nodes' cgroups, then remove the cgroups; returns how many died."""
    killed = pids(layout, node_names)
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while pids(layout, node_names) and time.monotonic() < deadline:
        time.sleep(0.1)
    for tree in hierarchies():
        for n in node_names:
            path = tree / name(layout, NodeSpec(n, 0, {}))
            if path.exists():
                for d in _subtree(path):
                    try:
                        d.rmdir()
                    except OSError:
                        pass
    return len(killed)
