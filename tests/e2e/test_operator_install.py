"""The operator installed by the Helm chart: a PSS-restricted pod, the RBAC it was given, and
admission of bad manifests.

The permissions the operator's ServiceAccount really has are read back from the API server with
`kubectl auth can-i --list` and compared with a committed allowlist, so any change to the
operator's RBAC (rbac.py -> chart) shows up as a reviewed diff of tests/e2e/data/rbac-allowlist.txt.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

DATA = Path(__file__).resolve().parent / "data"
ALLOWLIST = DATA / "rbac-allowlist.txt"
BAD = Path(__file__).resolve().parents[1] / "data" / "bad"


def test_operator_runs_as_the_charts_pod_under_restricted_pod_security(deployed):
    cluster = deployed.cluster
    ns = json.loads(cluster.kubectl("get", "namespace", deployed.namespace, "-o", "json"))
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    (pod,) = [p for p in deploy.operator_pods(cluster) if not p["metadata"].get("deletionTimestamp")]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"  # the chart's Deployment
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "localhost/rlkube/operator:dev"
    sc, psc = container["securityContext"], pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    statuses = pod["status"]["containerStatuses"]
    assert statuses[0]["ready"] is True and statuses[0]["restartCount"] == 0, statuses

    # The enforcing admission really checks: the same pod with one restricted setting removed is refused.
    probe = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pss-probe", "namespace": deployed.namespace},
        "spec": {**{k: v for k, v in pod["spec"].items() if k in ("securityContext", "serviceAccountName")},
                 "containers": [{**{k: v for k, v in container.items() if k in ("name", "image", "command", "args")},
                                 "securityContext": {**sc, "allowPrivilegeEscalation": True}}]},
    }  # fmt: skip
    with pytest.raises(RuntimeError, match="violates PodSecurity \"restricted"):
        cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(probe))


def _can_i_list(cluster, sa: str, namespace: str) -> list[str]:
    out = cluster.kubectl("auth", "can-i", "--list", f"--as={sa}", "-n", namespace)
    lines = []
    for line in out.splitlines()[1:]:  # the first line is the table header
        cols = re.split(r"\s{2,}", line.strip())
        if cols and cols[0]:
            lines.append("  ".join(cols))
    return sorted(lines)


def current_permissions(deployed) -> str:
    """What the operator's ServiceAccount may do, in the operator's and in a watched namespace."""
    sa = f"system:serviceaccount:{deployed.namespace}:{deployed.release}"
    sections = []
    for label, ns in (("operator namespace", deployed.namespace), ("watched namespace", deployed.jobs_namespace)):
        sections.append(f"== {label} ==\n" + "\n".join(_can_i_list(deployed.cluster, sa, ns)))
    return "\n".join(sections) + "\n"


def allowlist() -> tuple[str, str]:
    """(header comment, body) of the committed allowlist."""
    lines = ALLOWLIST.read_text().splitlines(keepends=True)
    header = "".join(line for line in lines if line.startswith("#"))
    return header, "".join(line for line in lines if not line.startswith("#"))


def test_service_account_permissions_match_the_committed_allowlist(deployed):
    # Regenerate with RLKUBE_UPDATE_ALLOWLIST=1 after a reviewed change to rbac.py.
    import os

    actual = current_permissions(deployed)
    header, committed = allowlist()
    if os.environ.get("RLKUBE_UPDATE_ALLOWLIST") == "1":
        ALLOWLIST.write_text(header + actual)
        committed = actual
    assert actual == committed, (
        "the operator's ServiceAccount can do something other than the allowlist says:\n" + actual
    )
    for line in actual.splitlines():
        if line.startswith("==") or line.startswith("["):  # a section title, or a non-resource URL row
            continue
        resource, verbs = line.split("  ")[0], line.split("  ")[-1]
        assert resource.split(".")[0] != "secrets" and resource != "*" and "*" not in verbs, line


# One of each kind of check the API server does: an OpenAPI bound, a type, a CEL cross-field rule,
# a CEL rule over a chain of roles, an unknown field (kubectl's strict field validation), the name.
# Each file's first line says the field path its error must name ("# expect: <path>").
BAD_SAMPLES = ["negative-gpus", "gpus-string", "critic-with-dpo", "colocate-cycle", "unknown-spec-field",
               "name-too-long"]


@pytest.mark.parametrize("sample", BAD_SAMPLES)
def test_bad_manifest_is_rejected_at_apply_with_the_field_path(deployed, sample):
    path = BAD / f"{sample}.yaml"
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path}: first line should be '# expect: <field path>'"
    field = first.removeprefix("# expect: ").strip()
    proc_error = None
    try:
        deployed.cluster.kubectl("apply", "-n", deployed.jobs_namespace, "-f", str(path))
    except RuntimeError as err:
        proc_error = str(err)
    if proc_error is None:
        deployed.cluster.kubectl("delete", "-n", deployed.jobs_namespace, "-f", str(path), check=False)
        pytest.fail(f"kubectl apply accepted tests/data/bad/{sample}.yaml")
    # Schema errors carry the full path (spec.roles.actor.gpus); CEL rules report at the object
    # that holds them and name the rest in their message ("spec.roles: ... roles.critic: ...").
    assert field in proc_error or field.removeprefix("spec.") in proc_error, proc_error
