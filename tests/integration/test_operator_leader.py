"""Leader election: of two operator replicas only the Lease holder acts; when it is killed the
standby takes over once the lease expires, and a replica restarted with its old identity takes
its lease back at once; the Lease is owned by the holder's Pod, so it goes when that pod goes."""

from __future__ import annotations

import time

import pytest
from operator_env import Env, Kubelet, Operator, tiny_spec, wait_until

pytestmark = pytest.mark.integration

SPEC = tiny_spec(1)


def lease_holder(env: Env) -> str | None:
    lease = env.api.get_lease(env.namespace, "rlkube-operator")
    return ((lease or {}).get("spec") or {}).get("holderIdentity")


def test_only_the_lease_holder_acts_and_a_standby_takes_over(control_plane, tmp_path):
    env = Env(control_plane.kubeconfig, control_plane.kubectl, prefix="lead")
    env.install_crd()
    env.create_namespace()
    env.add_node("n0", gpus=4)
    kubelet = Kubelet(env).start()
    first = Operator(env, tmp_path / "a", identity="replica-a")
    second = Operator(env, tmp_path / "b", identity="replica-b")
    try:
        first.start().wait_ready()
        second.start()
        wait_until("the standby waiting for the lease", lambda: "waiting for lease" in second.log_path.read_text(), 60)
        env.create_job("led", SPEC)
        wait_until("the job Running", lambda: env.status("led").get("phase") == "Running", 60,
                   diagnose=lambda: env.diagnose("led"))
        assert lease_holder(env) == "replica-a"
        assert "operator ready" not in second.log_path.read_text()
        assert "reconciled" not in second.log_path.read_text()   # the standby never acted

        first.kill()
        killed = time.monotonic()
        second.wait_ready(timeout=60)
        took_over = time.monotonic() - killed
        assert lease_holder(env) == "replica-b"
        # client-go's rule: expired only after leaseDurationSeconds (15) on the standby's clock
        assert 5 <= took_over <= 45, took_over
        pod = env.pods("led")[0]
        env.set_pod_status(pod, "Succeeded", exit_code=0)
        wait_until("the new leader finishing the job", lambda: env.status("led").get("phase") == "Succeeded", 30,
                   diagnose=lambda: env.diagnose("led") + "\n" + second.tail())

        transitions = env.api.get_lease(env.namespace, "rlkube-operator")["spec"]["leaseTransitions"]
        second.kill()
        again = Operator(env, tmp_path / "b2", identity="replica-b")
        again.start().wait_ready(timeout=60)
        # same identity (a restarted container of the same pod): renewed, not taken over after expiry
        assert env.api.get_lease(env.namespace, "rlkube-operator")["spec"]["leaseTransitions"] == transitions
        again.stop()
        assert lease_holder(env) in ("", None)  # released on SIGTERM: a standby need not wait
    finally:
        first.kill()
        second.kill()
        kubelet.stop()
        env.teardown()


def test_the_lease_is_owned_by_the_holders_pod_and_collected_with_it(control_plane, tmp_path):
    """What `helm uninstall` relies on: no operator pod left, no Lease left (the garbage collector
    deletes it), whatever order Helm deletes the operator's RBAC and Deployment in."""
    env = Env(control_plane.kubeconfig, control_plane.kubectl, prefix="own")
    env.create_namespace()
    # The operator's own Pod object, as the chart's Deployment would create it (never scheduled here).
    pod = env.api.request("POST", f"/api/v1/namespaces/{env.namespace}/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rlkube-operator-0"},
        "spec": {"containers": [{"name": "operator", "image": "localhost/rlkube/operator:dev"}]}})
    uid = pod["metadata"]["uid"]
    op = Operator(env, tmp_path, identity="rlkube-operator-0",
                  environ={"POD_NAME": "rlkube-operator-0", "POD_UID": uid})
    try:
        op.start().wait_ready()
        lease = env.api.get_lease(env.namespace, "rlkube-operator")
        assert lease["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "rlkube-operator-0", "uid": uid}]
        op.stop()
        env.api.request("DELETE", f"/api/v1/namespaces/{env.namespace}/pods/rlkube-operator-0",
                        query={"gracePeriodSeconds": "0"})
        wait_until("the garbage collector to delete the Lease",
                   lambda: env.api.get_lease(env.namespace, "rlkube-operator") is None, 90)
    finally:
        op.kill()
        env.teardown()
