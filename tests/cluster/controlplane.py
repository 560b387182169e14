"""The control plane: etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

Started the way Kubernetes' own local-up-cluster does, as plain processes with flags, all
listening on 127.0.0.1 only. etcd keeps its data on a tmpfs under the state directory: the
cluster is disposable and fsync on a shared 2-core disk is the slowest thing it would do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from . import bins, host, kubeconfig, pki, procs
from .api import Client, wait_for
from .layout import Layout

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"


def admin_client(layout: Layout, timeout: float = 10.0) -> Client:
    return Client(
        layout.server, layout.pki / "ca.crt", layout.pki / "admin.crt", layout.pki / "admin.key", timeout=timeout
    )


def make_credentials(layout: Layout) -> None:
    """Certificates, service-account keys and kubeconfigs of the control plane (idempotent)."""
    if not (layout.pki / "ca.crt").exists() and (layout.pki_cache / "ca.crt").exists():
        shutil.copytree(layout.pki_cache, layout.pki, dirs_exist_ok=True)
    p = layout.pki
    pki.ensure_ca(p)
    pki.service_account_keys(p)
    pki.issue(
        p,
        pki.Identity(
            "apiserver",
            "kube-apiserver",
            hosts=(
                "127.0.0.1", "localhost", layout.kubernetes_service_ip, layout.bridge_ip,
                "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                f"kubernetes.default.svc.{layout.cluster_domain}",
            ),
        ),
    )  # fmt: skip
    users = {
        "admin": ("kubernetes-admin", "system:masters"),
        "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
        "controller-manager": ("system:kube-controller-manager", None),
        "scheduler": ("system:kube-scheduler", None),
    }
    for stem, (cn, org) in users.items():
        crt, key = pki.issue(p, pki.Identity(stem, cn, org))
        if stem != "apiserver-kubelet-client":
            target = layout.kubeconfig if stem == "admin" else layout.state / f"{stem}.kubeconfig"
            kubeconfig.write(target, server=layout.server, ca=p / "ca.crt", cert=crt, key=key, user=cn)
    save_credentials(layout)


def save_credentials(layout: Layout) -> None:
    """Keep the certificates for the next cluster (see Layout.pki_cache)."""
    shutil.copytree(layout.pki, layout.pki_cache, dirs_exist_ok=True)


def _mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(path)]).returncode != 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=0700", "tmpfs", str(path)], check=True)


def start_etcd(layout: Layout) -> None:
    data = layout.state / "etcd"
    _mount_tmpfs(data)
    client = f"http://127.0.0.1:{layout.etcd_client_port}"
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    procs.start(
        layout.state,
        ETCD,
        [
            str(bins.etcd()),
            "--name=rlkube", f"--data-dir={data}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=rlkube={peer}", "--initial-cluster-state=new",
            "--snapshot-count=10000", "--quota-backend-bytes=1073741824",
        ],
    )  # fmt: skip


def start_apiserver(layout: Layout) -> None:
    p = layout.pki
    procs.start(
        layout.state,
        APISERVER,
        [
            str(bins.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{layout.etcd_client_port}",
            "--bind-address=127.0.0.1", f"--secure-port={layout.apiserver_port}",
            f"--service-cluster-ip-range={layout.service_cidr}",
            "--authorization-mode=Node,RBAC",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--tls-cert-file={p / 'apiserver.crt'}", f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            # Node names are not in any DNS; every kubelet listens on its node IP (the pod bridge).
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-account-issuer=https://kubernetes.default.svc.{layout.cluster_domain}",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--allow-privileged=true", "--profiling=false", "--event-ttl=1h",
            # Trace what each helper's tests do without drowning the log on a busy machine.
            "--v=1",
        ],
    )  # fmt: skip


def start_controllers(layout: Layout) -> None:
    p = layout.pki
    kcm_cfg = layout.state / "controller-manager.kubeconfig"
    procs.start(
        layout.state,
        CONTROLLER_MANAGER,
        [
            str(bins.path("kube-controller-manager")),
            f"--kubeconfig={kcm_cfg}",
            f"--authentication-kubeconfig={kcm_cfg}", f"--authorization-kubeconfig={kcm_cfg}",
            # Every controller, so the garbage collector, Job and EndpointSlice controllers run.
            "--controllers=*",
            f"--service-account-private-key-file={p / 'sa.key'}", f"--root-ca-file={p / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p / 'ca.crt'}", f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={layout.service_cidr}",
            "--bind-address=127.0.0.1", f"--secure-port={layout.controller_manager_port}",
            "--leader-elect=false", "--profiling=false", "--v=1",
        ],
    )  # fmt: skip
    sched_cfg = layout.state / "scheduler.kubeconfig"
    procs.start(
        layout.state,
        SCHEDULER,
        [
            str(bins.path("kube-scheduler")),
            f"--kubeconfig={sched_cfg}",
            f"--authentication-kubeconfig={sched_cfg}", f"--authorization-kubeconfig={sched_cfg}",
            "--bind-address=127.0.0.1", f"--secure-port={layout.scheduler_port}",
            "--leader-elect=false", "--profiling=false", "--v=1",
        ],
    )  # fmt: skip


def start(layout: Layout, timeout: float = 180.0) -> None:
    """Start the whole control plane and wait until it serves (bounded by `timeout` per stage)."""
    host.ensure(host.CONTROL_PLANE if os.environ.get("RLKUBE_ETCD") == "system" else {"openssl": "openssl"})
    make_credentials(layout)
    start_etcd(layout)
    start_apiserver(layout)
    client = admin_client(layout, timeout=5)

    def apiserver_ready() -> bool:
        procs.check_alive(layout.state, ETCD, APISERVER)
        return client.healthy("/readyz")

    wait_for("kube-apiserver /readyz", apiserver_ready, timeout,
             diagnose=lambda: procs.log_tail(layout.state, APISERVER))  # fmt: skip
    start_controllers(layout)

    def default_service_account() -> bool:
        # The serviceaccount controller makes it; pods are refused until it exists.
        procs.check_alive(layout.state, CONTROLLER_MANAGER, SCHEDULER)
        client.get("/api/v1/namespaces/default/serviceaccounts/default")
        return True

    wait_for("the controller-manager (default ServiceAccount)", default_service_account, timeout,
             diagnose=lambda: procs.log_tail(layout.state, CONTROLLER_MANAGER))  # fmt: skip
    wait_for("kube-scheduler healthz", lambda: procs.check_alive(layout.state, SCHEDULER) or _healthz(layout.scheduler_port),
             timeout, diagnose=lambda: procs.log_tail(layout.state, SCHEDULER))  # fmt: skip


def _healthz(port: int) -> bool:
    import ssl
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # self-signed serving cert of the component; loopback only
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=3) as resp:
            return resp.read() == b"ok"
    except OSError:
        return False


def status(layout: Layout) -> dict[str, bool]:
    return {name: procs.running(layout.state, name) for name in (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER)}
