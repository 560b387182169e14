"""The kind node image, built here with no registry: `python3 tests/cluster/kindnode.py [--load]`.

`kind build node-image` needs a registry (its base image `kindest/base`, and it pulls every image
kubeadm lists that it did not build), so this builds the same kind of image from local parts:

- the root filesystem: the harness's debootstrap base (`localhost/rlkube/base:bookworm`) plus
  Debian's systemd, containerd, runc, CNI plugins, iptables and the few tools kind's scripts call;
- kind's own entrypoint, systemd units, containerd config and helper scripts, read from the kind
  Go module the harness builds kind from (`images/base/files` of sigs.k8s.io/kind@<version>);
  what differs from kind's is set on top (see `_containerd_config`);
- kubelet, kubectl (the harness's build), kubeadm, kube-proxy (kind-bins.sh kindnode);
- the control-plane and add-on images under the names `kubeadm config images list` prints, built
  FROM scratch around the same binaries (kube-apiserver, -controller-manager, -scheduler, etcd,
  CoreDNS), kube-proxy FROM the base plus iptables, pause from images/pause; imported, not
  unpacked, into the node's containerd store at build time (as kind's own build does), so a node
  starts with them and pulls nothing.

No kindnetd and no local-path provisioner: kind.py creates the cluster with `disableDefaultCNI`
and writes each node's CNI config (ptp + host-local over the node's podCIDR) and routes itself;
the storage class is a no-provisioner one (the e2e tests bind static volumes).

The image is cached by a hash of its inputs (this file, the binaries, the base image, the kind
module's files): `~/.cache/rlkube/images/kindnode-<hash>.tar`, tagged
`localhost/rlkube/kindnode:<hash>`; a warm run builds nothing and `--load` loads it into the
project's Docker engine only when the engine lacks that tag.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.cluster"

from tests.cluster import bins, images  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = images.CACHE
K8S_VERSION = "v1.34.4"
REGISTRY = "registry.k8s.io"
# What kubeadm v1.34 names (`kubeadm config images list`); etcd and CoreDNS are the harness's
# builds (etcd v3.6.16, CoreDNS v1.12.1) under kubeadm's tags.
PAUSE = f"{REGISTRY}/pause:3.10.1"
ETCD = f"{REGISTRY}/etcd:3.6.5-0"
COREDNS = f"{REGISTRY}/coredns/coredns:v1.12.1"
PACKAGES = ("systemd containerd runc containernetworking-plugins iptables nftables conntrack iproute2 ethtool "
            "util-linux mount kmod libseccomp2 procps socat jq")  # fmt: skip
KUBE_PROXY_PACKAGES = "iptables conntrack nftables"
# Recipe version: bump when the way the image is made changes without its inputs changing.
RECIPE = 1


def _run(*cmd: str, **kw) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def buildah(*args: str, **kw) -> str:
    return _run("buildah", *images.storage_args(), *args, **kw).strip()


def kind_module_dir() -> Path:
    """sigs.k8s.io/kind's module source (downloaded by `go mod download`, read-only)."""
    out = _run("go", "mod", "download", "-json", "sigs.k8s.io/kind", cwd=HERE / "go" / "kind",
               env={**os.environ, "GOFLAGS": "-mod=mod"})  # fmt: skip
    return Path(json.loads(out)["Dir"])


def binaries() -> dict[str, Path]:
    """Every binary the node and its images carry, building what is missing (cached)."""
    subprocess.run([str(HERE / "kind-bins.sh"), "kindnode", "coredns", "runc-caps"], check=True)
    k8s = bins.kubectl().parent
    found = {name: k8s / name for name in ("kubelet", "kubectl", "kube-apiserver", "kube-controller-manager",
                                           "kube-scheduler")}  # fmt: skip
    found["etcd"] = bins.etcd()
    bin_cache = CACHE / "bin"
    found["kubeadm"] = bin_cache / f"kindnode-{K8S_VERSION}" / "kubeadm"
    found["kube-proxy"] = bin_cache / f"kindnode-{K8S_VERSION}" / "kube-proxy"
    found["coredns"] = next(bin_cache.glob("coredns-*/coredns"))
    found["runc-caps"] = max(bin_cache.glob("runc-caps-*/runc-caps"), key=lambda p: p.stat().st_mtime)
    for name, path in found.items():
        if not path.exists():
            raise RuntimeError(f"kind node image: {name} is missing at {path}")
    return found


def input_hash(found: dict[str, Path], kind_files: Path, base: str, pause: Path) -> str:
    h = hashlib.sha256(f"recipe-{RECIPE} {PACKAGES} {KUBE_PROXY_PACKAGES} {base} {pause.name}".encode())
    h.update(Path(__file__).read_bytes())
    for name in sorted(found):
        h.update(name.encode())
        with open(found[name], "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    for p in sorted(kind_files.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(kind_files)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _staging(root: Path, files: dict[str, Path]) -> Path:
    """A folder with `files` (path in image -> source) and an empty /tmp, to copy into an image."""
    (root / "tmp").mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    for dest, src in files.items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        target.chmod(0o755)
    return root


def _scratch_image(ref: str, files: dict[str, Path], entrypoint: list[str] | None, work: Path) -> None:
    ctr = buildah("from", "scratch")
    try:
        buildah("copy", ctr, str(_staging(work / ref.replace("/", "_"), files)), "/")
        opts = ["--env", "PATH=/usr/local/bin:/usr/bin:/bin"]
        if entrypoint:
            opts += ["--entrypoint", json.dumps(entrypoint)]
        buildah("config", *opts, ctr)
        buildah("commit", "--quiet", ctr, ref)
    finally:
        buildah("rm", ctr)


def _apt_install(ctr: str, packages: str) -> None:
    """apt-get install in a buildah container of the Debian base (services kept from starting)."""
    script = (
        "set -e; printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; "
        "apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        f"{packages} >/dev/null; rm -f /usr/sbin/policy-rc.d; apt-get clean; rm -rf /var/lib/apt/lists/* "
        "/usr/share/doc/* /usr/share/man/*"
    )
    buildah("run", "--isolation", "chroot", ctr, "--", "sh", "-c", script)


def component_images(found: dict[str, Path], work: Path) -> list[str]:
    """Build the images a kubeadm control plane and its add-ons run; returns their refs."""
    refs = []
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        ref = f"{REGISTRY}/{name}:{K8S_VERSION}"
        _scratch_image(ref, {f"/usr/local/bin/{name}": found[name]}, None, work)
        refs.append(ref)
    _scratch_image(ETCD, {"/usr/local/bin/etcd": found["etcd"]}, None, work)
    _scratch_image(COREDNS, {"/coredns": found["coredns"]}, ["/coredns"], work)
    refs += [ETCD, COREDNS]
    proxy = f"{REGISTRY}/kube-proxy:{K8S_VERSION}"
    ctr = buildah("from", images.BASE_IMAGE)
    try:
        _apt_install(ctr, KUBE_PROXY_PACKAGES)
        buildah("copy", "--chmod", "0755", ctr, str(found["kube-proxy"]), "/usr/local/bin/kube-proxy")
        buildah("commit", "--quiet", ctr, proxy)
    finally:
        buildah("rm", ctr)
    return [*refs, proxy]


def _containerd_config(kind_config: str) -> str:
    """kind's containerd config with what this machine and Debian's containerd 1.6 need."""
    out = kind_config.replace('sandbox_image = "registry.k8s.io/pause:3.10"', f'sandbox_image = "{PAUSE}"')
    # root lacks CAP_SYS_RESOURCE here (docs/cluster.md): no process may lower its OOM score.
    out = out.replace("restrict_oom_score_adj = false", "restrict_oom_score_adj = true")
    # Privileged pods (kube-proxy) ask for every capability; runc-caps drops the missing ones.
    out = out.replace(
        "    SystemdCgroup = true\n",
        '    SystemdCgroup = true\n    BinaryName = "/usr/local/sbin/runc-caps"\n',
        1,
    )
    if out.count("restrict_oom_score_adj = true") != 1 or "runc-caps" not in out or PAUSE not in out:
        raise RuntimeError("kind's containerd config.toml changed shape: update kindnode._containerd_config")
    return out


STORAGE_CLASS = """apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
"""


def _node_files(found: dict[str, Path], kind_files: Path, root: Path) -> Path:
    """Everything the node image adds on top of the packages, laid out as in the image."""
    shutil.copytree(kind_files, root, dirs_exist_ok=True)
    for p in root.rglob("*"):  # the module cache is read-only; the image wants the usual modes
        p.chmod(0o755 if p.is_dir() else 0o644)
    root.chmod(0o755)
    (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    for d, mode in (("usr/local/bin", 0o755), ("kind/bin", 0o755)):
        for f in (root / d).iterdir():
            f.chmod(mode)
    cfg = root / "etc" / "containerd" / "config.toml"
    cfg.write_text(_containerd_config(cfg.read_text()))
    spec = json.loads(_run("ctr", "oci", "spec"))
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append(
        {"path": "/kind/bin/mount-product-files.sh"}
    )
    spec["process"].pop("rlimits", None)
    (root / "etc" / "containerd" / "cri-base.json").write_text(json.dumps(spec, indent=1))
    for name in ("kubelet", "kubectl", "kubeadm"):
        shutil.copy2(found[name], root / "usr" / "bin" / name)
    (root / "usr" / "local" / "sbin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(found["runc-caps"], root / "usr" / "local" / "sbin" / "runc-caps")
    (root / "kind" / "version").write_text(K8S_VERSION)
    (root / "kind" / "manifests").mkdir(parents=True, exist_ok=True)
    (root / "kind" / "manifests" / "default-storage.yaml").write_text(STORAGE_CLASS)
    (root / "etc" / "kubernetes" / "manifests").mkdir(parents=True, exist_ok=True)
    return root


SETUP = """set -e
ln -sf /usr/bin/containerd /usr/local/bin/containerd
ln -sf /usr/bin/ctr /usr/local/bin/ctr
mkdir -p /opt/cni && rm -rf /opt/cni/bin && ln -s /usr/lib/cni /opt/cni/bin
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
  /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
  /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >> /etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
"""


def _preload(mountpoint: Path, archives: list[Path], work: Path) -> None:
    """Import image archives, unpacked later by the node's CRI, into the rootfs's containerd store.

    A containerd of the same version as the node's (Debian's, on the host) runs against the
    image's /var/lib/containerd with its own socket and state, then stops.
    """
    state, sock = work / "ctrd-state", work / "ctrd.sock"
    cfg = work / "ctrd.toml"
    cfg.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                   f'[grpc]\n  address = "{sock}"\n')  # fmt: skip
    log = open(work / "containerd.log", "wb")
    proc = subprocess.Popen(["containerd", "--config", str(cfg), "--root", str(mountpoint / "var/lib/containerd"),
                             "--state", str(state)], stdout=log, stderr=log)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "-a", str(sock), "version"], capture_output=True).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"containerd for the preload did not start: {(work / 'containerd.log').read_text()}"
                )
            time.sleep(0.3)
        for archive in archives:
            _run("ctr", "-a", str(sock), "-n", "k8s.io", "images", "import", "--no-unpack", "--all-platforms",
                 "--digests", str(archive))  # fmt: skip
        # The pause image is built as localhost/rlkube/pause:dev; containerd's sandbox_image names it.
        _run("ctr", "-a", str(sock), "-n", "k8s.io", "images", "tag", images.ref_for("pause"), PAUSE)
        listed = _run("ctr", "-a", str(sock), "-n", "k8s.io", "images", "ls", "-q")
        print(f"kind node image: preloaded {len(listed.split())} image names")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["umount", "-R", str(state)], capture_output=True)


def _archive(ref: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    buildah("push", "--quiet", ref, f"docker-archive:{tmp}:{ref}")
    tmp.rename(path)


def _build(found: dict[str, Path], kind_files: Path, ref: str, archive: Path, work: Path) -> None:
    pause = images.build("pause")
    refs = component_images(found, work)
    archives = [pause.path]
    for r in refs:
        archives.append(work / (r.replace("/", "_").replace(":", "_") + ".tar"))
        _archive(r, archives[-1])
        buildah("rmi", r)
    ctr = buildah("from", images.BASE_IMAGE)
    try:
        _apt_install(ctr, PACKAGES)
        buildah("copy", ctr, str(_node_files(found, kind_files, work / "nodefiles")), "/")
        buildah("run", "--isolation", "chroot", ctr, "--", "sh", "-c", SETUP)
        mountpoint = Path(buildah("mount", ctr))
        _preload(mountpoint, archives, work)
        buildah("umount", ctr)
        buildah("config", "--entrypoint", '["/usr/local/bin/entrypoint", "/sbin/init"]', "--cmd", "",
                "--env", "container=docker", "--stop-signal", "SIGRTMIN+3", ctr)  # fmt: skip
        buildah("commit", "--quiet", ctr, ref)
    finally:
        subprocess.run(["buildah", *images.storage_args(), "rm", ctr], capture_output=True)
    _archive(ref, archive)
    buildah("rmi", ref)


def build() -> tuple[str, Path]:
    """The node image's ref and docker-archive, built unless cached."""
    found = binaries()
    kind_files = kind_module_dir() / "images" / "base" / "files"
    base = images.ensure_base()
    pause = images.build("pause")
    digest = input_hash(found, kind_files, base, pause.path)
    ref, archive = f"localhost/rlkube/kindnode:{digest}", CACHE / "images" / f"kindnode-{digest}.tar"
    with open(CACHE / "images" / ".kindnode.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists():
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="rlkube-kindnode-", dir=os.environ.get("TMPDIR")) as tmp:
                _build(found, kind_files, ref, archive, Path(tmp))
            for old in (CACHE / "images").glob("kindnode-*.tar"):
                if old != archive:
                    old.unlink()
            print(f"kind node image: built {ref} in {time.monotonic() - t0:.0f} s")
    return ref, archive


def load(ref: str, archive: Path, env: dict[str, str]) -> bool:
    """Load the node image into the Docker engine of `env` unless it has the tag; True if loaded."""
    docker = shutil.which("docker", path="/usr/bin") or "docker"
    if subprocess.run([docker, "image", "inspect", ref], env=env, capture_output=True).returncode == 0:
        return False
    _run(docker, "load", "-i", str(archive), env=env)
    # Earlier node images (other input hashes) are only disk now: 1.1 GB each.
    tags = _run(docker, "images", "--format", "{{.Repository}}:{{.Tag}}", "localhost/rlkube/kindnode", env=env).split()
    stale = [t for t in tags if t != ref]
    if stale:
        subprocess.run([docker, "rmi", *stale], env=env, capture_output=True)
    return True


def main(argv: list[str]) -> int:
    ref, archive = build()
    print(f"{ref} {archive}")
    if "--load" in argv:
        from tests.cluster import docker_engine

        loaded = load(ref, archive, docker_engine.up())
        print("loaded into the engine" if loaded else "already in the engine")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
