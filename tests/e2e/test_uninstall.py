"""A second release of the chart, watching one namespace only: its RBAC is namespaced, and
`helm uninstall` takes away every object the release made (the CRD stays, as Helm intends).

The session's own release keeps running meanwhile; two releases coexist because each has its own
names, its own leader-election Lease namespace and, here, disjoint watched namespaces.
"""

from __future__ import annotations

import json

import pytest

from rlkube.operator.controller import rbac
from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RELEASE = "rlkube-scoped"
NAMESPACE = "rlkube-scoped-system"
WATCHED = "rlkube-scoped-jobs"
# Namespaced kinds a release could leave behind, and the cluster-scoped ones.
NAMESPACED = ["deployments", "replicasets", "pods", "services", "serviceaccounts", "configmaps", "roles",
              "rolebindings", "leases", "endpoints"]
CLUSTER = ["clusterroles", "clusterrolebindings"]


def _rules(obj: dict) -> list[dict]:
    return [{k: r[k] for k in ("apiGroups", "resources", "verbs")} for r in obj["rules"]]


def _leftovers(cluster) -> list[str]:
    found = []
    selector = f"app.kubernetes.io/instance={RELEASE}"
    for kind in NAMESPACED:
        out = cluster.kubectl("get", kind, "--all-namespaces", "-l", selector, "-o", "name")
        found += out.split()
    for kind in CLUSTER:
        found += cluster.kubectl("get", kind, "-l", selector, "-o", "name").split()
    # Objects the operator makes at run time carry no Helm labels: look for them by namespace.
    found += [f"{NAMESPACE}/{n}" for n in cluster.kubectl("get", "leases", "-n", NAMESPACE, "-o", "name").split()]
    return found


def test_namespaced_release_installs_scoped_rbac_and_uninstalls_without_leftovers(deployed):
    cluster = deployed.cluster
    deploy.ensure_namespace(cluster, WATCHED)
    deploy.install(cluster, RELEASE, NAMESPACE, deploy.local_values(watchNamespaces=[WATCHED]), upgrade=False)

    name = RELEASE  # the chart's full name: the release name already contains "rlkube"
    role = json.loads(cluster.kubectl("get", "role", f"{name}-watched", "-n", WATCHED, "-o", "json"))
    assert _rules(role) == rbac.rules_for("watched")
    cluster_role = json.loads(cluster.kubectl("get", "clusterrole", name, "-o", "json"))
    assert _rules(cluster_role) == rbac.cluster_role_rules(clusterwide=False)
    (pod,) = deploy.operator_pods(cluster, RELEASE, NAMESPACE)
    assert f"--namespace={WATCHED}" in pod["spec"]["containers"][0]["args"]
    # It may not touch jobs outside its namespace (the session's namespace, say).
    sa = f"system:serviceaccount:{NAMESPACE}:{name}"
    assert cluster.kubectl("auth", "can-i", "create", "pods", f"--as={sa}", "-n", deployed.jobs_namespace,
                           check=False).strip() == "no"
    assert cluster.kubectl("auth", "can-i", "create", "pods", f"--as={sa}", "-n", WATCHED).strip() == "yes"

    deploy.helm(cluster, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
    deploy.wait_until("the release's pods to be gone",
                      lambda: not deploy.operator_pods(cluster, RELEASE, NAMESPACE), 120)
    # The operator's Lease is owned by its pod: the garbage collector takes it shortly after.
    left: list[str] = []

    def none_left() -> bool:
        left[:] = _leftovers(cluster)
        return not left

    deploy.wait_until("no objects of the release left", none_left, 90, describe=lambda: f"left: {left}")
    # Helm never deletes CRDs: the RLTrainingJob API (and any jobs) outlive the operator.
    cluster.kubectl("get", "crd", "rltrainingjobs.rlkube.io")
    # The session's release is untouched.
    deploy.wait_operator_ready(cluster)
    cluster.kubectl("delete", "namespace", NAMESPACE, WATCHED, "--wait=false")
