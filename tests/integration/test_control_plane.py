"""The harness's control plane is a real one: it serves, enforces RBAC and collects garbage."""

from __future__ import annotations

import json
import time
import uuid

import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def namespace(control_plane):
    name = f"cp-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def test_apiserver_serves_the_pinned_version(control_plane):
    version = json.loads(control_plane.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"].startswith("v1.34."), version
    assert control_plane.api.get("/readyz") == "ok"


def test_rbac_is_enforced(control_plane, namespace):
    sa = f"system:serviceaccount:{namespace}:reader"
    control_plane.kubectl("-n", namespace, "create", "serviceaccount", "reader")
    ask = ("auth", "can-i", "list", "configmaps", "-n", namespace, f"--as={sa}")
    assert control_plane.kubectl(*ask, check=False).strip() == "no"
    control_plane.kubectl("-n", namespace, "create", "role", "read-cm", "--verb=list", "--resource=configmaps")
    control_plane.kubectl("-n", namespace, "create", "rolebinding", "read-cm", "--role=read-cm",
                          f"--serviceaccount={namespace}:reader")  # fmt: skip
    # The RBAC authorizer caches nothing; the binding takes effect on the next request.
    assert control_plane.kubectl(*ask, check=False).strip() == "yes"
    # And the apiserver really refuses a request the role does not grant.
    with pytest.raises(RuntimeError, match="Forbidden|forbidden"):
        control_plane.kubectl("-n", namespace, "get", "secrets", f"--as={sa}")


def test_garbage_collector_deletes_owned_objects(control_plane, namespace):
    control_plane.kubectl("-n", namespace, "create", "configmap", "owner")
    uid = control_plane.kubectl("-n", namespace, "get", "configmap", "owner", "-o", "jsonpath={.metadata.uid}")
    child = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "child",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}],
        },
    }
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(child))
    control_plane.kubectl("-n", namespace, "delete", "configmap", "owner")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = control_plane.kubectl("-n", namespace, "get", "configmap", "child", "--ignore-not-found", "-o", "name")
        if not out.strip():
            return
        time.sleep(0.5)
    pytest.fail("the garbage collector did not delete the owned ConfigMap within 60 s")
