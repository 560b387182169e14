"""The pod network on the host: one bridge, its addresses, and cleaning up after pods.

The bridge is made by the harness (not by the CNI plugin) so that the host side is fixed before
any kubelet starts: the kubelets use its address as their node IP, the DNS server listens on it,
and the apiserver relay listens on the `kubernetes` Service address added to it. The CNI bridge
plugin is told `isGateway: false`, so it neither re-addresses the bridge nor turns on the host's
IP forwarding: pods on the one /16 reach each other at layer 2 and nothing beyond the host.

The bridge gets a fixed MAC address. Left to itself, a Linux bridge takes the lowest MAC of its
ports, so it changes whenever a pod's veth joins or leaves; every pod's ARP entry for the host
then points at a MAC that is no longer the host's, and traffic to the host (the apiserver relay,
DNS) is lost until the entry expires. Seen here: the operator's API calls timed out for ~40 s
each time a training job's pods ended, long enough to lose its leader lease.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from .layout import Layout


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def bridge_up(layout: Layout) -> None:
    if _ip("link", "show", layout.bridge, check=False).returncode != 0:
        _ip("link", "add", layout.bridge, "type", "bridge")
    prefix = ipaddress.ip_network(layout.pod_network).prefixlen
    addrs = _ip("-o", "addr", "show", "dev", layout.bridge).stdout
    for addr in (f"{layout.bridge_ip}/{prefix}", f"{layout.kubernetes_service_ip}/32"):
        if f" {addr} " not in addrs:
            _ip("addr", "add", addr, "dev", layout.bridge)
    _ip("link", "set", layout.bridge, "address", layout.bridge_mac)
    _ip("link", "set", layout.bridge, "up")


def bridge_down(layout: Layout) -> None:
    # Host ends of veths still on the bridge (their pod namespace outlived a killed containerd)
    # first, while `master` still names them as ours; then the bridge with its addresses.
    for line in _ip("-o", "link", "show", "type", "veth", check=False).stdout.splitlines():
        if f"master {layout.bridge} " in line:
            name = line.split(":", 2)[1].strip().split("@")[0]
            _ip("link", "del", name, check=False)
    _ip("link", "del", layout.bridge, check=False)


def unmount_under(root: Path) -> list[str]:
    """Unmount (lazily, deepest first) every mount point at or under `root`; returns them."""
    prefix = str(root.resolve())
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    return points
