"""The Helm chart, rendered by the real helm and checked by the real API server.

`helm lint --strict` must be clean; `helm template` output must pass the API server's
server-side dry-run (its OpenAPI schemas, RBAC escalation checks and Pod Security admission);
the rendered RBAC must equal rlkube.operator.controller.rbac's rules in both watch modes, with a reason
above every verb; the values schema must turn bad values away naming the key.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from rlkube.operator.controller import rbac
from tests.cluster import bins

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlkube"
NAMESPACE = "rlkube-chart-test"
WATCHED = ["rlkube-chart-team-a", "rlkube-chart-team-b"]
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(bins.helm()), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def kube_version() -> str:
    # helm template assumes an old Kubernetes unless told (the chart needs >= 1.30): the harness's.
    return bins.version("kubernetes")


def render_text(*sets: str, include_crds: bool = False) -> str:
    args = ["template", "rlkube", str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version()]
    if include_crds:
        args.append("--include-crds")
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def render(*sets: str, include_crds: bool = False) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_text(*sets, include_crds=include_crds)) if d]


def one(docs: list[dict], kind: str, name: str | None = None, namespace: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"{kind} {name or ''}: found {len(found)}"
    return found[0]


def rules(obj: dict) -> list[dict]:
    return [{k: r[k] for k in ("apiGroups", "resources", "verbs")} for r in obj["rules"]]


NAMESPACED_SET = [f"watchNamespaces={{{','.join(WATCHED)}}}"]


# -- helm lint and values schema ---------------------------------------------------------------------


OBSERVABILITY_SET = ["dashboard.enabled=true", "prometheusRule.enabled=true", "metrics.podMonitor.enabled=true",
                     "metrics.serviceMonitor.enabled=true"]


@pytest.mark.parametrize("sets", [[], NAMESPACED_SET, ["metrics.serviceMonitor.enabled=true"], OBSERVABILITY_SET],
                         ids=["all-namespaces", "namespaced", "servicemonitor", "observability"])
def test_helm_lint_strict_is_clean(sets):
    args = ["lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize(
    ("bad", "key"),
    [
        ("logLevel=verbose", "logLevel"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("metrics.port=70000", "port"),
        ("resources.limits.memory=lots", "memory"),
        ("replicas=2", "replicas"),  # not a value of this chart: one operator, leader-elected
        ("prometheusRule.thresholds.gpuBusyRatio=2", "gpuBusyRatio"),
        ("prometheusRule.thresholds.pendingMinutes=0", "pendingMinutes"),
        ("compileCache.mountPath=cache", "mountPath"),
        ("compileCache.claimName=Team_Cache", "claimName"),
    ],
)
def test_values_schema_rejects_bad_values_naming_the_key(bad, key):
    proc = helm("template", "rlkube", str(CHART), "--kube-version", kube_version(), "--set", bad, check=False)
    assert proc.returncode != 0, f"--set {bad} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert key in proc.stderr, proc.stderr


def test_service_monitor_needs_the_metrics_service():
    proc = helm("template", "rlkube", str(CHART), "--kube-version", kube_version(),
                "--set", "metrics.serviceMonitor.enabled=true",
                "--set", "metrics.service.enabled=false", check=False)
    assert proc.returncode != 0 and "metrics.service.enabled" in proc.stderr, proc.stderr


# -- what the templates render -------------------------------------------------------------------------


def test_crds_come_from_the_one_source():
    docs = render(include_crds=True)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    source = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    assert crds == source


def test_rendered_cluster_wide_rbac_equals_rbac_py():
    docs = render()
    assert rules(one(docs, "ClusterRole", "rlkube")) == rbac.cluster_role_rules(clusterwide=True)
    assert rules(one(docs, "Role", "rlkube-operator", NAMESPACE)) == rbac.rules_for("operator")
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-watched")]
    binding = one(docs, "ClusterRoleBinding", "rlkube")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rlkube", "namespace": NAMESPACE}]


def test_rendered_namespaced_rbac_equals_rbac_py():
    docs = render(*NAMESPACED_SET)
    assert rules(one(docs, "ClusterRole", "rlkube")) == rbac.cluster_role_rules(clusterwide=False)
    for ns in WATCHED:
        assert rules(one(docs, "Role", "rlkube-watched", ns)) == rbac.rules_for("watched")
        binding = one(docs, "RoleBinding", "rlkube-watched", ns)
        assert binding["roleRef"]["name"] == "rlkube-watched"
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    assert rules(one(docs, "Role", "rlkube-operator", NAMESPACE)) == rbac.rules_for("operator")


def verbs_with_reasons(text: str) -> list[tuple[str, str]]:
    """(verb, reason) for every verb of every `verbs:` block of rendered YAML; reason '' if none."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "verbs:":
            indent = len(lines[i]) - len(lines[i].lstrip())
            i += 1
            reason = ""
            while i < len(lines) and len(lines[i]) - len(lines[i].lstrip()) > indent:
                item = lines[i].strip()
                if item.startswith("# "):
                    reason = item[2:]
                elif item.startswith("- "):
                    found.append((item[2:], reason))
                    reason = ""
                i += 1
            continue
        i += 1
    return found


@pytest.mark.parametrize("sets", [[], NAMESPACED_SET], ids=["all-namespaces", "namespaced"])
def test_every_rendered_verb_has_its_reason_as_a_comment_and_nothing_is_wildcarded(sets):
    pairs = verbs_with_reasons(render_text(*sets))
    granted = [v for d in render(*sets) if d["kind"] in ("ClusterRole", "Role") for r in d["rules"] for v in r["verbs"]]
    assert [verb for verb, _ in pairs] == granted
    assert all(len(reason) >= 10 for _, reason in pairs), [p for p in pairs if len(p[1]) < 10]
    for doc in render(*sets):
        for rule in doc.get("rules", []) if doc["kind"] in ("ClusterRole", "Role") else []:
            assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
            assert "secrets" not in rule["resources"], rule


def test_operator_deployment_is_a_single_restricted_recreated_pod():
    deployment = one(render(), "Deployment", "rlkube")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["rlkube", "operator"]
    assert container["args"] == ["--all-namespaces", "--log-level=info", "--node-lost-grace-seconds=60",
                                 "--metrics-port=8080", "--liveness=http://0.0.0.0:8081/healthz",
                                 "--lease-name=rlkube"]
    for probe in ("startupProbe", "livenessProbe"):  # kopf's liveness endpoint
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8081, "metrics": 8080}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["enableServiceLinks"] is False  # else RLKUBE_METRICS_PORT=tcp://... from the Service
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAMESPACE"] == "metadata.namespace" and env["POD_NAME"] == "metadata.name"

    scoped = one(render(*NAMESPACED_SET, "logLevel=debug"), "Deployment", "rlkube")
    assert scoped["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        f"--namespace={WATCHED[0]}", f"--namespace={WATCHED[1]}", "--log-level=debug"]


def test_the_compile_cache_volume_reaches_the_operators_flags():
    for value, flag in (("claimName=team-cache", "--compile-cache-claim=team-cache"),
                        ("hostPath=/var/lib/rlkube-compile", "--compile-cache-host-path=/var/lib/rlkube-compile")):
        (container,) = one(render(f"compileCache.{value}"), "Deployment", "rlkube")["spec"]["template"]["spec"][
            "containers"]
        assert flag in container["args"] and "--compile-cache-path=/var/cache/rlkube/compile" in container["args"]


def test_metrics_service_and_service_monitor_toggles():
    assert one(render(), "Service", "rlkube-metrics")["spec"]["ports"][0]["port"] == 8080
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    assert not [d for d in render("metrics.service.enabled=false") if d["kind"] == "Service"]
    monitor = one(render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"),
                  "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == one(render(), "Deployment")["spec"]["selector"]["matchLabels"]


def test_dashboard_rule_and_pod_monitor_render_only_when_enabled():
    kinds = ("PrometheusRule", "PodMonitor")
    default = render()
    assert not [d for d in default if d["kind"] in kinds or "grafana_dashboard" in d["metadata"].get("labels", {})]

    docs = render(*OBSERVABILITY_SET, "prometheusRule.thresholds.pendingMinutes=45",
                  "prometheusRule.labels.release=prom", "dashboard.namespace=monitoring")
    dashboard = one(docs, "ConfigMap", "rlkube-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    shipped = json.loads((CHART / "dashboards" / "rlkube-jobs.json").read_text())
    assert json.loads(dashboard["data"]["rlkube-jobs.json"]) == shipped

    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {"RLTrainingJobWaitingTooLong", "RLTrainingJobGpusIdle", "RLTrainingJobRestarting",
                           "RLTrainingJobNoProgress"}
    assert alerts["RLTrainingJobWaitingTooLong"]["for"] == "45m"
    assert "$labels.rltj" in alerts["RLTrainingJobNoProgress"]["annotations"]["summary"]  # not eaten by helm
    assert "${" not in json.dumps(rule)

    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert monitor["spec"]["selector"]["matchLabels"] == {"rlkube.io/pod-index": "0"}
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_rlkube_io_job"], "targetLabel": "rltj"} in (
        monitor["spec"]["podMetricsEndpoints"][0]["relabelings"])
    scoped = one(render(*NAMESPACED_SET, "metrics.podMonitor.enabled=true"), "PodMonitor")
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": WATCHED}
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"] is True


# -- the API server's verdict ------------------------------------------------------------------------------


def kubectl(control_plane, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(bins.kubectl()), f"--kubeconfig={control_plane.kubeconfig}", *args],
                          input=input, capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def namespaces(control_plane):
    for name in [NAMESPACE, *WATCHED]:
        labels = RESTRICTED if name == NAMESPACE else {}
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        proc = kubectl(control_plane, "apply", "-f", "-", input=json.dumps(ns))
        assert proc.returncode == 0, proc.stderr
    yield control_plane
    kubectl(control_plane, "delete", "namespace", NAMESPACE, *WATCHED, "--wait=false")


@pytest.mark.parametrize("sets", [[], NAMESPACED_SET], ids=["all-namespaces", "namespaced"])
def test_rendered_chart_passes_server_side_dry_run(namespaces, sets):
    docs = [d for d in render(*sets, include_crds=True) if d["kind"] != "ServiceMonitor"]
    stream = "\n---\n".join(yaml.safe_dump(d) for d in docs)
    proc = kubectl(namespaces, "apply", "--dry-run=server", "-f", "-", input=stream)
    assert proc.returncode == 0, proc.stderr
    applied = [line for line in proc.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(docs), proc.stdout
    # The CRD may exist already (another test installed it): kubectl's note about its missing
    # last-applied annotation is not a verdict on the manifests; any other warning is.
    warnings = [w for w in proc.stderr.splitlines() if w.startswith("Warning") and "last-applied-configuration" not in w]
    assert not warnings, proc.stderr


def test_operator_pod_is_admitted_under_restricted_pod_security(namespaces):
    deployment = one(render(), "Deployment", "rlkube")
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "rlkube-operator-pss", "namespace": NAMESPACE, "labels": template["metadata"]["labels"]},
           "spec": {**template["spec"], "serviceAccountName": "default"}}  # fmt: skip
    proc = kubectl(namespaces, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr

    # The check bites: the same pod running as root is refused by the namespace's enforce label.
    pod["spec"]["securityContext"] = {**pod["spec"]["securityContext"], "runAsNonRoot": False, "runAsUser": 0}
    proc = kubectl(namespaces, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
    assert proc.returncode != 0 and 'violates PodSecurity "restricted' in proc.stderr, proc.stderr
