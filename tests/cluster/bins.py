"""Where the harness's binaries are, and building them when they are missing.

Kubernetes, etcd, helm, kwok, Kueue and promtool are built from wrapper Go modules under `tests/cluster/go/`
by `build-bins.sh` into `~/.cache/rlkube/bin/<component>-<version>/` (override the root with
RLKUBE_BIN_CACHE, or the project's whole cache with RLKUBE_CACHE). The version of a component is
the one its wrapper module requires, so bumping a pin in a go.mod is the whole upgrade. etcd is
v3.6 built from go.etcd.io/etcd/server/v3. Debian's `etcd-server` (3.4.23) can be chosen with RLKUBE_ETCD=system,
but the 1.34 apiserver's watch cache falls behind it ("Too large resource version" on lists,
seen here): requests stalled for 30 s while the e2e tests ran, and the operator lost its lease.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO = HERE / "go"
BUILD_SCRIPT = HERE / "build-bins.sh"

# component -> (the module its wrapper pins, the binaries it provides)
COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "kubernetes": (
        "k8s.io/kubernetes",
        ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"),
    ),
    "etcd": ("go.etcd.io/etcd/server/v3", ("etcd",)),
    "helm": ("helm.sh/helm/v3", ("helm",)),
    "kwok": ("sigs.k8s.io/kwok", ("kwok",)),
    "kueue": ("sigs.k8s.io/kueue", ("kueue",)),
    # Prometheus tags its Go module v0.<major*100+minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
    "promtool": ("github.com/prometheus/prometheus", ("promtool",)),
}
_BINARY_COMPONENT = {b: c for c, (_, bs) in COMPONENTS.items() for b in bs}


class MissingBinary(RuntimeError):
    """A binary the harness needs is neither cached nor buildable here."""


def cache_root() -> Path:
    cache = Path(os.environ.get("RLKUBE_CACHE", Path.home() / ".cache" / "rlkube"))
    return Path(os.environ.get("RLKUBE_BIN_CACHE", cache / "bin"))


def version(component: str) -> str:
    """The version the component's wrapper go.mod requires (e.g. "v1.34.4")."""
    module = COMPONENTS[component][0]
    text = (GO / component / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.M)
    if not m:
        raise MissingBinary(f"tests/cluster/go/{component}/go.mod does not require {module}")
    return m.group(1)


def component_dir(component: str) -> Path:
    return cache_root() / f"{component}-{version(component)}"


def cached(binary: str) -> Path | None:
    """The cached path of `binary` if it was built, else None."""
    path = component_dir(_BINARY_COMPONENT[binary]) / binary
    # build-bins.sh writes .stamp last: without it the folder is from an older or broken build.
    return path if os.access(path, os.X_OK) and (path.parent / ".stamp").exists() else None


def build(*components: str) -> None:
    """Build the components that are not cached yet (slow the first time: see docs/cluster.md)."""
    if shutil.which("go") is None:
        raise MissingBinary("the Go toolchain (`go`) is needed to build the cluster binaries")
    subprocess.run([str(BUILD_SCRIPT), *components], check=True)


def etcd() -> Path:
    """etcd: the pinned build (v3.6), or the system's with RLKUBE_ETCD=system (see the docstring)."""
    if os.environ.get("RLKUBE_ETCD") == "system":
        system = shutil.which("etcd")
        if system is None:
            raise MissingBinary("RLKUBE_ETCD=system but there is no etcd on PATH (Debian: etcd-server)")
        return Path(system)
    return path("etcd")


def path(binary: str, *, build_missing: bool = True) -> Path:
    """The path of a harness binary, building its component first when needed."""
    found = cached(binary)
    if found is None and build_missing:
        build(_BINARY_COMPONENT[binary])
        found = cached(binary)
    if found is None:
        comp = _BINARY_COMPONENT[binary]
        raise MissingBinary(
            f"{binary} is not built: run `tests/cluster/build-bins.sh {comp}` "
            f"(expected in {component_dir(comp)})"
        )
    return found


def kubectl() -> Path:
    return path("kubectl")


def helm() -> Path:
    return path("helm")


def kwok() -> Path:
    return path("kwok")


def kueue() -> Path:
    """Kueue's manager (sigs.k8s.io/kueue/cmd/kueue); tests/cluster/kueue.py runs it."""
    return path("kueue")


def promtool() -> Path:
    """Prometheus' promtool (github.com/prometheus/prometheus/cmd/promtool): checks and unit-tests
    the chart's alerting rules (tests/integration/test_alert_rules.py)."""
    return path("promtool")
