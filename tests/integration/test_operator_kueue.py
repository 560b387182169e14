"""The operator with real Kueue: queued jobs wait visibly, run when admitted, and a preempted job
is suspended and resumes in a new attempt once Kueue admits it again (docs/kueue.md).

Real API server and scheduler, real Kueue (the `kueue` fixture), the operator as a subprocess with
exactly its RBAC rules; nodes and kubelets as in test_operator_lifecycle (operator_env)."""

from __future__ import annotations

import json

import pytest
from operator_env import Env, Kubelet, Operator, drop_cluster_rbac, restricted_kubeconfig, wait_until
from test_kueue_admission import Queues

from rlkube.operator import kueue_workload as kw
from tests.cluster import procs

pytestmark = pytest.mark.integration

GANG = {  # one pod of 2 GPUs: the ClusterQueue's 2 GPUs hold one such job at a time
    "algorithm": "dpo",
    "model": {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259}},
    "roles": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
    "data": {"source": "synthetic", "format": "synthetic"},
    "image": "localhost/rlkube/runtime-cpu:dev",
    "imagePullPolicy": "Never",
    "placement": {"gpusPerPod": 2, "gangTimeoutSeconds": 60},
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
}


@pytest.fixture(scope="module")
def env(kueue, tmp_path_factory):
    e = Env(kueue.kubeconfig, kueue.kubectl, prefix="okq")
    e.layout = kueue.layout
    e.install_crd()
    e.create_namespace()
    e.add_node("n0", gpus=8)          # more GPUs than the quota: Kueue, not the nodes, limits
    e.queues = Queues(e)
    e.queues.create()
    kubelet = Kubelet(e).start()
    operator = Operator(e, tmp_path_factory.mktemp("operator-logs"),
                        kubeconfig=restricted_kubeconfig(e, tmp_path_factory.mktemp("operator-rbac"))).start()
    operator.wait_ready()
    e.operator = operator
    yield e
    operator.stop()
    kubelet.stop()
    for job in e.api.list_jobs(e.namespace):
        e.delete_job(job["metadata"]["name"])
    workloads = f"/apis/{kw.API_VERSION}/namespaces/{e.namespace}/workloads"
    wait_until("the Workloads collected with their jobs", lambda: not e.api.request("GET", workloads)["items"], 60)
    e.queues.delete()
    drop_cluster_rbac(e)
    e.teardown()


@pytest.fixture(autouse=True)
def logs_on_failure(request, env):
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print("\n--- operator log (tail) ---\n" + env.operator.tail(120))
        print("\n--- kueue log (tail) ---\n" + procs.log_tail(env.layout.state, "kueue", 40))


def submit(env: Env, name: str, priority: str) -> None:
    spec = json.loads(json.dumps(GANG))
    spec["priorityClassName"] = env.queues.priorities[priority][0]
    body = env.job_body(name, spec)
    body["metadata"]["labels"] = {kw.QUEUE_LABEL: env.queues.local_queue}
    env.api.request("POST", f"/apis/rlkube.io/v1alpha1/namespaces/{env.namespace}/rltrainingjobs", body=body)


def progressing(env: Env, name: str) -> dict:
    return next((c for c in env.status(name).get("conditions") or [] if c["type"] == "Progressing"), {})


def running(env: Env, name: str):
    return lambda: env.status(name).get("phase") == "Running" and env.status(name)


def test_queued_jobs_wait_for_kueue_and_a_preempted_job_resumes(env):
    diagnose = lambda: env.diagnose("first", "second", "urgent")  # noqa: E731
    submit(env, "first", "low")
    wait_until("the first job Running", running(env, "first"), 90, diagnose=diagnose)
    assert {"Queued", "AdmittedByKueue", "Running"} <= set(env.event_reasons("first"))

    submit(env, "second", "low")
    queued = wait_until("the second job waiting for GPU quota", lambda: (
        progressing(env, "second").get("reason") == "QueuedInKueue"
        and "nvidia.com/gpu" in progressing(env, "second").get("message", "")), 60, diagnose=diagnose)
    assert queued and env.status("second")["phase"] == "Pending" and not env.pods("second")
    assert progressing(env, "second")["message"].startswith(
        f"waiting for Kueue admission in queue {env.queues.local_queue}: ")

    submit(env, "urgent", "high")       # Kueue preempts the first (lower priority) for it
    wait_until("the urgent job Running", running(env, "urgent"), 90, diagnose=diagnose)
    first = env.status("first")
    assert first["phase"] == "Pending" and first["attempt"] == 1 and first["restarts"] == 0, first
    assert not env.pods("first") and "Evicted" in env.event_reasons("first")
    assert env.status("second")["phase"] == "Pending"

    env.delete_job("second")            # so the first is the one the freed quota goes to
    for pod in env.pods("urgent"):
        env.set_pod_status(pod, "Succeeded", exit_code=0)
    wait_until("the urgent job Succeeded", lambda: env.status("urgent").get("phase") == "Succeeded", 60,
               diagnose=diagnose)
    resumed = wait_until("the first job Running again", running(env, "first"), 90, diagnose=diagnose)
    assert resumed["attempt"] == 1 and resumed["restarts"] == 0
    assert {p["metadata"]["labels"]["rlkube.io/attempt"] for p in env.pods("first")} == {"1"}
    workload = env.api.request("GET", f"/apis/{kw.API_VERSION}/namespaces/{env.namespace}/workloads/rltj-urgent")
    assert kw.observe_workload(workload).finished
