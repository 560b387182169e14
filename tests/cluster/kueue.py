"""Kueue on the test cluster: its CRDs, its manager as a host process, its webhooks.

Kueue is built from its Go module (tests/cluster/go/kueue, `bins.kueue()`); its CRDs and webhook
manifests are read from the same module's source in the Go module cache, so the API the tests
see is the one the binary serves. docs/kueue.md says why it runs this way; in short:

- The manager runs on the host against the admin kubeconfig, no leader election, every port on
  127.0.0.1 (shifted by 100 per RLKUBE_CLUSTER_INDEX, like the control plane's).
- Webhooks are served, not disabled: Kueue validates and defaults its own kinds (ClusterQueue,
  LocalQueue, Workload, ...) only in its webhooks, and Workload, ClusterQueue, LocalQueue and
  Cohort have two API versions converted by its /convert endpoint. The serving certificate comes
  from the cluster CA (pki.py) for 127.0.0.1, and the harness registers the webhook
  configurations and CRD conversion with `url: https://127.0.0.1:<port>/...` (the apiserver is a
  host process too; on kind, where it runs in a node container, the kind network's gateway:
  kind.host_address). Only the webhooks of Kueue's own group are registered: the job
  integrations' webhooks (batch/job is on by default and cannot be listed away) would gate every
  Job or Pod of the cluster, and rlkube does not use them.
- Kueue reads its metrics certificate from the fixed path /etc/kueue/metrics/certs when it does
  not manage certificates itself (cmd/kueue/main.go), and its own certificate management makes
  certificates for a Service name the apiserver cannot reach here. So the manager runs in a
  private mount namespace where that path is a bind mount of the harness's certificate folder:
  nothing is written under /etc but the empty mount point.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from . import bins, pki, procs
from .api import ApiError, Client, wait_for
from .controlplane import admin_client
from .kind import host_address
from .layout import Layout

KUEUE = "kueue"
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"
METRICS_CERTS = "/etc/kueue/metrics/certs"   # fixed in Kueue's main.go
WEBHOOK_NAMES = {"mutating": "rlkube-harness-kueue-mutating", "validating": "rlkube-harness-kueue-validating"}
FIELD_MANAGER = "rlkube-harness"


def webhook_port(layout: Layout) -> int:
    return 9443 + 100 * layout.index


def health_port(layout: Layout) -> int:
    return 8081 + 100 * layout.index


def metrics_port(layout: Layout) -> int:
    return 8543 + 100 * layout.index


def source_dir() -> Path:
    """Kueue's module source in the Go module cache (downloaded by the build if missing)."""
    version = bins.version(KUEUE)
    proc = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True) if shutil.which("go") else None
    cache = Path(proc.stdout.strip()) if proc and proc.returncode == 0 and proc.stdout.strip() else Path.home() / "go/pkg/mod"
    src = cache / "sigs.k8s.io" / f"kueue@{version}"
    if not (src / "config").is_dir():
        subprocess.run(["go", "mod", "download", f"sigs.k8s.io/kueue@{version}"], cwd=bins.GO / KUEUE, check=True)
    return src


def _load_yaml(path: Path) -> list[dict]:
    import yaml  # the fixtures run in the project's virtualenv; the stdlib harness never gets here

    # The Workload CRD alone is 1.4 MB of YAML: libyaml's loader reads it in a second, not ten.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(path.read_text(), Loader=loader) if doc]


def _state(layout: Layout) -> Path:
    return layout.state / "kueue"


def _certificates(layout: Layout) -> Path:
    """Folder with tls.crt/tls.key for the webhook server (and the metrics server)."""
    certs = _state(layout) / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    crt, key = pki.issue(layout.pki, pki.Identity("kueue-webhook", "kueue-webhook", hosts=(host_address(layout), "127.0.0.1", "localhost")))
    shutil.copyfile(crt, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    return certs


def _ca_bundle(layout: Layout) -> str:
    return base64.b64encode((layout.pki / "ca.crt").read_bytes()).decode()


def _converted_crds(src: Path) -> set[str]:
    """Plurals of the CRDs Kueue's own install converts by webhook (its kustomization's patches)."""
    text = (src / "config/components/crd/kustomization.yaml").read_text()
    return set(re.findall(r"^- path: patches/webhook_in_(\w+)\.yaml", text, re.M))


def install_crds(layout: Layout, client: Client) -> None:
    """Server-side apply Kueue's CRDs, with /convert on 127.0.0.1 where Kueue's install has it."""
    src = source_dir()
    converted = _converted_crds(src)
    names, server = [], f"https://{host_address(layout)}:{webhook_port(layout)}"
    for path in sorted((src / "config/components/crd/bases").glob("*.yaml")):
        for crd in _load_yaml(path):
            if crd["spec"]["names"]["plural"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{server}/convert", "caBundle": _ca_bundle(layout)},
                        "conversionReviewVersions": ["v1"],
                    },
                }  # fmt: skip
            name = crd["metadata"]["name"]
            client.request("PATCH", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
                           f"?fieldManager={FIELD_MANAGER}&force=true", crd, "application/apply-patch+yaml")
            names.append(name)

    def established() -> bool:
        for name in names:
            crd = client.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
            if conds.get("Established") != "True":
                return False
        return True

    wait_for("Kueue's CRDs Established", established, 60)


def webhook_configurations(layout: Layout) -> list[dict]:
    """Kueue's webhook configurations, only the webhooks of its own group, pointing at 127.0.0.1."""
    out, server = [], f"https://{host_address(layout)}:{webhook_port(layout)}"
    for config in _load_yaml(source_dir() / "config/components/webhook/manifests.yaml"):
        kind = "mutating" if config["kind"] == "MutatingWebhookConfiguration" else "validating"
        hooks = [h for h in config["webhooks"] if all(r.get("apiGroups") == [GROUP] for r in h.get("rules", []))]
        for hook in hooks:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"{server}{path}", "caBundle": _ca_bundle(layout)}
        config["metadata"] = {"name": WEBHOOK_NAMES[kind], "labels": {"app.kubernetes.io/managed-by": FIELD_MANAGER}}
        config["webhooks"] = hooks
        out.append(config)
    return out


def _config(layout: Layout, certs: Path) -> Path:
    """Kueue's Configuration (JSON is YAML): everything on 127.0.0.1, our certificates."""
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port(layout)}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port(layout)}"},
        "webhook": {"host": host_address(layout), "port": webhook_port(layout), "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # The on-demand visibility API is an aggregated apiserver nothing here registers.
        "featureGates": {"VisibilityOnDemand": False},
    }
    path = _state(layout) / "config.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _ready(layout: Layout) -> bool:
    procs.check_alive(layout.state, KUEUE)
    # readyz includes the webhook server having started (cmd/kueue/main.go setupProbeEndpoints).
    with urllib.request.urlopen(f"http://127.0.0.1:{health_port(layout)}/readyz", timeout=5) as resp:
        return resp.status == 200


def _ensure_namespace(client: Client) -> None:
    try:
        client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    except ApiError as err:
        if err.status != 409:
            raise


def _register_webhooks(layout: Layout, client: Client) -> None:
    for config in webhook_configurations(layout):
        plural = "mutatingwebhookconfigurations" if config["kind"].startswith("Mutating") else "validatingwebhookconfigurations"
        client.request("PATCH", f"/apis/admissionregistration.k8s.io/v1/{plural}/{config['metadata']['name']}"
                       f"?fieldManager={FIELD_MANAGER}&force=true", config, "application/apply-patch+yaml")


def _webhooks_answer(client: Client) -> bool:
    """A dry-run ResourceFlavor create goes through Kueue's mutating and validating webhooks."""
    flavor = {"apiVersion": f"{GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "harness-probe"}}
    try:
        client.post(f"/apis/{GROUP}/v1beta2/resourceflavors?dryRun=All", flavor)
    except ApiError as err:
        if err.status != 409:
            raise
    return True


def start(layout: Layout, timeout: float = 180.0) -> None:
    """Install Kueue's CRDs and webhooks and start its manager (once per cluster)."""
    client = admin_client(layout)
    if not procs.running(layout.state, KUEUE):
        binary = bins.kueue()
        certs = _certificates(layout)
        _ensure_namespace(client)
        install_crds(layout, client)
        config = _config(layout, certs)
        script = f'mkdir -p {METRICS_CERTS} && mount --bind "$0" {METRICS_CERTS} && exec "$@"'
        procs.start(layout.state, KUEUE, [
            "unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(certs),
            str(binary), f"--config={config}", f"--kubeconfig={layout.kubeconfig}", "--zap-log-level=2",
        ])  # fmt: skip
    wait_for("Kueue ready (readyz)", lambda: _ready(layout), timeout, interval=0.5,
             diagnose=lambda: procs.log_tail(layout.state, KUEUE))
    _register_webhooks(layout, client)
    wait_for("Kueue's webhooks answering the apiserver", lambda: _webhooks_answer(client), 60, interval=0.5,
             diagnose=lambda: procs.log_tail(layout.state, KUEUE))


def stop(layout: Layout) -> None:
    """Unregister the webhooks (a dead webhook would refuse every Kueue object) and stop Kueue.
    The CRDs stay: objects of a later session's tests are theirs to clean up."""
    client = admin_client(layout)
    for plural, name in (("mutatingwebhookconfigurations", WEBHOOK_NAMES["mutating"]),
                         ("validatingwebhookconfigurations", WEBHOOK_NAMES["validating"])):
        try:
            client.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")
        except ApiError as err:
            if err.status != 404:
                raise
    procs.stop(layout.state, KUEUE)
