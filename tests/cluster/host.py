"""Debian packages the harness needs on the host, installed when missing (a fresh CI machine).

Control plane: etcd-server (etcd) and openssl. Nodes: containerd, runc, the CNI plugins,
buildah and debootstrap (for images), iproute2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CONTROL_PLANE = {"etcd": "etcd-server", "openssl": "openssl"}
NODES = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "buildah": "buildah",
    "debootstrap": "debootstrap",
    "ip": "iproute2",
    "mountpoint": "util-linux",
}
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


def cni_bin_dir() -> str | None:
    for d in CNI_BIN_DIRS:
        if Path(d, "bridge").exists() and Path(d, "host-local").exists():
            return d
    return None


def ensure(commands: dict[str, str], *, cni: bool = False) -> None:
    """Install the packages of the missing commands with apt-get; raise naming them if it cannot."""
    packages = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None})
    if cni and cni_bin_dir() is None:
        packages.append("containernetworking-plugins")
    if not packages:
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise RuntimeError(f"the cluster harness needs these packages: {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
                   check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
