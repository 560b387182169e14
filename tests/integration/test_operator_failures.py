"""Nothing the cluster does leaves a job stuck or silent, against a real API server: each failure
class shows its reason in a condition and an Event within one reconcile, a config error costs no
restart, and a lost node (Ready Unknown, or tainted out-of-service) re-plans the gang and
force-deletes the pods stranded there. As in test_operator_lifecycle.py there are no kubelets:
the test writes pod and node status through the API (operator_env.Kubelet keeps the other nodes
Ready and runs their pods)."""

from __future__ import annotations

import json

import pytest
from operator_env import Env, Kubelet, Operator, now_sec, tiny_spec, wait_until

from rlkube.operator.controller.kubeapi import ApiError
from rlkube.runtime.contract.pod import LABEL_JOB

pytestmark = pytest.mark.integration

DPO = tiny_spec(2, imagePullPolicy="Never", placement={"gpusPerPod": 2, "gangTimeoutSeconds": 30})
GRACE = 4  # --node-lost-grace-seconds of the operator under test


@pytest.fixture(scope="module")
def env(control_plane, tmp_path_factory):
    e = Env(control_plane.kubeconfig, control_plane.kubectl, prefix="fail")
    e.install_crd()
    e.create_namespace()
    for i in range(3):
        e.add_node(f"n{i}", gpus=2, labels={"topology.kubernetes.io/zone": "z"})
    kubelet = Kubelet(e).start()
    operator = Operator(e, tmp_path_factory.mktemp("operator-logs"),
                        extra=["--node-lost-grace-seconds", str(GRACE)]).start()
    operator.wait_ready()
    e.kubelet, e.operator = kubelet, operator
    e.silenced = []  # nodes taken from the fake kubelet (deleted at the end)
    yield e
    operator.stop()
    kubelet.stop()
    for name in e.silenced:
        e.delete_node(name)
    e.teardown()


@pytest.fixture(autouse=True)
def report_and_clean_up(request, env):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print("\n--- operator log (tail) ---\n" + env.operator.tail(150))
    for job in env.api.list_jobs(env.namespace):
        env.delete_job(job["metadata"]["name"])
    wait_until("the test's pods collected", lambda: not env.pods(), 60)


def spec(**overrides) -> dict:
    out = json.loads(json.dumps(DPO))
    out.update(overrides)
    return out


def condition(env: Env, job: str, type_: str) -> dict:
    return next((c for c in env.status(job).get("conditions") or [] if c["type"] == type_), {})


def event(env: Env, job: str, reason: str) -> dict | None:
    return next((e for e in env.events(job) if e["reason"] == reason), None)


def running(env: Env, name: str, **overrides) -> list[dict]:
    env.create_job(name, spec(**overrides))
    wait_until("Running", lambda: env.status(name).get("phase") == "Running", 60, diagnose=lambda: env.diagnose(name))
    return env.pods(name)


def terminate(env: Env, pod: dict, exit_code: int, message: str) -> None:
    """What a kubelet reports for a trainer that exited with `exit_code`, leaving `message` as
    its termination message."""
    meta = pod["metadata"]
    container = {"name": "trainer", "ready": False, "restartCount": 0, "image": pod["spec"]["containers"][0]["image"],
                 "imageID": "", "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message,
                                                         "startedAt": now_sec(), "finishedAt": now_sec()}}}
    env.api.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                    body={"status": {"phase": "Failed", "containerStatuses": [container],
                                     "conditions": [{"type": "Ready", "status": "False"}]}},
                    content_type="application/merge-patch+json")


def test_a_config_error_fails_at_once_naming_the_field_and_costs_no_restart(env):
    (pod,) = running(env, "cfg")
    error = {"error": {"exit": "config", "field": "data.source",
                       "message": "data.source: '/data/missing.jsonl' does not exist"}}
    terminate(env, pod, 3, json.dumps(error))
    wait_until("Failed", lambda: env.status("cfg").get("phase") == "Failed", 30, diagnose=lambda: env.diagnose("cfg"))
    failed = condition(env, "cfg", "Failed")
    assert failed["reason"] == "ExitCode"
    assert "config error: data.source: '/data/missing.jsonl' does not exist" in failed["message"]
    wait_until("the ExitCode Event", lambda: event(env, "cfg", "ExitCode"), 10)
    assert "data.source" in event(env, "cfg", "ExitCode")["message"]
    st = env.status("cfg")
    assert st["restarts"] == 0 and st["attempt"] == 0


def test_a_crash_restarts_with_its_reason_in_the_event(env):
    (pod,) = running(env, "crash")
    terminate(env, pod, 1, json.dumps({"error": {"exit": "crash", "message": "RuntimeError: NCCL timeout"}}))
    wait_until("the PodFailed Event", lambda: event(env, "crash", "PodFailed"), 30,
               diagnose=lambda: env.diagnose("crash"))
    assert "exited with code 1: crash: RuntimeError: NCCL timeout" in event(env, "crash", "PodFailed")["message"]
    assert env.status("crash")["restarts"] == 1


ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICY = "rlkube-test-no-tmp-host-path"


@pytest.fixture
def tmp_host_paths_refused(env):
    """A cluster's own rule that rlkube cannot know of: a ValidatingAdmissionPolicy refusing, as
    Invalid (422) and naming spec.volumes, the pods of job 'clash' that mount hostPath /tmp.
    (Every mistake rlkube's pods used to meet at the API server, such as a user volume named like
    the pod's own 'dshm', is refused at admission now, so a policy stands in for what is left.)"""
    pod = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    env.api.request("POST", f"{ADMISSION}/validatingadmissionpolicies", body={
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [pod]}, "validations": [{
            "expression": "!has(object.spec.volumes) || "
                          "!object.spec.volumes.exists(v, has(v.hostPath) && v.hostPath.path == '/tmp')",
            "message": "spec.volumes: hostPath /tmp is not allowed on this cluster", "reason": "Invalid"}]}})
    env.api.request("POST", f"{ADMISSION}/validatingadmissionpolicybindings", body={
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {"policyName": POLICY, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.namespace}},
            "objectSelector": {"matchLabels": {LABEL_JOB: "clash"}}}}})
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "policy-probe", "labels": {LABEL_JOB: "clash"}},
             "spec": {"containers": [{"name": "c", "image": "probe"}], "volumes": [{"name": "t", "hostPath": {"path": "/tmp"}}]}}

    def in_force() -> bool:
        try:
            env.api.request("POST", f"/api/v1/namespaces/{env.namespace}/pods?dryRun=All", body=probe)
        except ApiError as exc:
            return exc.status == 422
        return False

    try:
        wait_until("the admission policy in force", in_force, 30)
        yield
    finally:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            env.api.request("DELETE", f"{ADMISSION}/{kind}/{POLICY}")


def test_a_pod_the_api_server_refuses_fails_the_job_naming_the_field(env, tmp_host_paths_refused):
    env.create_job("clash", spec(volumes=[{"name": "scratch", "mountPath": "/data", "hostPath": "/tmp"}]))
    wait_until("Failed", lambda: env.status("clash").get("phase") == "Failed", 30,
               diagnose=lambda: env.diagnose("clash"))
    failed = condition(env, "clash", "Failed")
    assert failed["reason"] == "CreateRejected" and "spec.volumes" in failed["message"], failed
    wait_until("the CreateRejected Event", lambda: event(env, "clash", "CreateRejected"), 10)
    assert not [p for p in env.pods("clash") if not p["metadata"].get("deletionTimestamp")]


def test_an_unsatisfiable_node_selector_is_named_as_the_cause(env):
    env.create_job("nowhere", spec(nodeSelector={"pool": "a100"}))
    wait_until("Pending", lambda: env.status("nowhere").get("phase") == "Pending", 30,
               diagnose=lambda: env.diagnose("nowhere"))
    placed = condition(env, "nowhere", "Placed")
    assert placed["reason"] == "Unschedulable" and "do not match nodeSelector pool=a100" in placed["message"]
    wait_until("the Unschedulable Event", lambda: event(env, "nowhere", "Unschedulable"), 10)
    assert "nodeSelector pool=a100" in event(env, "nowhere", "Unschedulable")["message"]


def silence(env: Env, node: str) -> None:
    """The node's kubelet stops: no more heartbeats, and nothing completes its pods' deletion."""
    env.nodes.remove(node)
    env.silenced.append(node)


def replanned_away(env: Env, name: str, lost: str):
    def check():
        pods = env.pods(name)
        st = env.status(name)
        return (st.get("phase") == "Running" and st.get("attempt") == 1 and pods
                and all(p["spec"].get("nodeName") not in (None, lost) for p in pods) and st)
    return check


@pytest.mark.parametrize("how", ["unknown", "out-of-service"])
def test_a_lost_node_replans_the_gang_and_force_deletes_its_pods(env, how):
    name = f"lost-{how[:3]}"
    (pod,) = running(env, name)
    lost = pod["spec"]["nodeName"]
    silence(env, lost)
    if how == "unknown":
        # What the node lifecycle controller writes once the kubelet's lease expires: the node
        # Ready Unknown, its pods not Ready.
        env.api.request("PATCH", f"/api/v1/nodes/{lost}/status", content_type="application/merge-patch+json",
                        body={"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                                         "reason": "NodeStatusUnknown", "lastTransitionTime": now_sec(),
                                                         "lastHeartbeatTime": now_sec()}]}})
        meta = pod["metadata"]
        env.api.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        content_type="application/merge-patch+json",
                        body={"status": {"conditions": [{"type": "Ready", "status": "False",
                                                         "lastTransitionTime": now_sec()}]}})
    else:
        env.api.request("PATCH", f"/api/v1/nodes/{lost}", content_type="application/merge-patch+json",
                        body={"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                                                   "value": "nodeshutdown", "effect": "NoExecute"}]}})
    st = wait_until("re-planned away from the lost node", replanned_away(env, name, lost), 90,
                    diagnose=lambda: env.diagnose(name))
    assert st["restarts"] == 0  # a node loss is not the job's failure
    node_lost = event(env, name, "NodeLost")
    assert node_lost is not None and f"node {lost}" in node_lost["message"]
    assert pod["metadata"]["name"] in node_lost["message"]  # force-deleted: no kubelet would finish it
    assert not [p for p in env.pods(name) if p["metadata"]["uid"] == pod["metadata"]["uid"]]
