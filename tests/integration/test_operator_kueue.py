"""The operator with real Kueue: queued jobs wait visibly, run when admitted, and a preempted job
is suspended and resumes in a new attempt once Kueue admits it again (docs/kueue.md).

Real API server and scheduler, real Kueue (the `kueue` fixture), the operator as a subprocess with
exactly its RBAC rules; nodes and kubelets as in test_operator_lifecycle (operator_env)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from operator_env import (
    Env,
    Kubelet,
    Operator,
    drop_cluster_rbac,
    restricted_kubeconfig,
    tiny_spec,
    wait_until,
)
from test_kueue_admission import Queues

from rlkube.operator.render import kueue_workload as kw
from tests.cluster import procs

pytestmark = pytest.mark.integration

# one pod of 2 GPUs: the ClusterQueue's 2 GPUs hold one such job at a time
GANG = tiny_spec(2, imagePullPolicy="Never", placement={"gpusPerPod": 2, "gangTimeoutSeconds": 60},
                 resources={"requests": {"cpu": "1", "memory": "1Gi"}})


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


# Elastic: 1..4 pods of 1 GPU. Kueue is asked for 4 pods (minCount 1); the ClusterQueue's 2 GPUs
# let it admit only 2, while the node's 8 GPUs would fit all 4.
ELASTIC = {**GANG, "roles": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
           "placement": {"gpusPerPod": 1, "gangTimeoutSeconds": 60}, "elastic": {"minWorkers": 1, "maxWorkers": 4}}
ONE_GPU = {**GANG, "roles": {"actor": {"gpus": 1}, "reference": {"colocateWith": "actor"}},
           "placement": {"gpusPerPod": 1, "gangTimeoutSeconds": 60}}


def submit(env: Env, name: str, priority: str, gang: dict = GANG) -> None:
    spec = json.loads(json.dumps(gang))
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


def gpus_of(pod: dict) -> int:
    return int(pod["spec"]["containers"][0]["resources"]["requests"].get("nvidia.com/gpu", "0"))


class PodSampler:
    """Every 0.25 s, in a thread: the live pods (not Succeeded/Failed; terminating ones count) of
    each job of the namespace, and the GPUs they request together."""

    def __init__(self, env: Env) -> None:
        self.env, self.samples = env, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-sampler", daemon=True)

    def __enter__(self) -> PodSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            live = [p for p in self.env.pods() if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            pods: dict[str, int] = {}
            for p in live:
                job = p["metadata"]["labels"]["rlkube.io/job"]
                pods[job] = pods.get(job, 0) + 1
            self.samples.append((time.monotonic(), pods, sum(gpus_of(p) for p in live)))
            self._stop.wait(0.25)

    def most(self, job: str, since: float = 0.0) -> int:
        return max((pods.get(job, 0) for t, pods, _ in self.samples if t >= since), default=0)

    def most_gpus(self) -> int:
        return max((gpus for _, _, gpus in self.samples), default=0)


def clear_jobs(env: Env) -> None:
    """Delete the jobs earlier tests left (their Workloads go with them, and the quota back)."""
    for job in env.api.list_jobs(env.namespace):
        env.delete_job(job["metadata"]["name"])
    workloads = f"/apis/{kw.API_VERSION}/namespaces/{env.namespace}/workloads"
    wait_until("the earlier tests' Workloads gone", lambda: not env.api.request("GET", workloads)["items"], 60)
    wait_until("the earlier tests' pods gone", lambda: not env.pods(), 60)


def event_messages(env: Env, job: str, reason: str) -> list[str]:
    return [e.get("message", "") for e in env.events(job) if e["reason"] == reason]


def test_partly_admitted_elastic_job_runs_at_the_admitted_size_and_follows_its_admission(env):
    clear_jobs(env)
    diagnose = lambda: env.diagnose("elastic", "urgent-one")  # noqa: E731
    workload_path = f"/apis/{kw.API_VERSION}/namespaces/{env.namespace}/workloads/rltj-elastic"
    with PodSampler(env) as sampler:
        submit(env, "elastic", "low", ELASTIC)
        run = wait_until("the elastic job Running", running(env, "elastic"), 90, diagnose=diagnose)
        # The Workload as stored still has minCount: Kueue's webhook drops it when its
        # PartialAdmission gate is off (on by default since v0.5; the harness leaves it so).
        [pod_set] = env.api.request("GET", workload_path)["spec"]["podSets"]
        assert (pod_set["count"], pod_set["minCount"]) == (4, 1)
        assert kw.observe_workload(env.api.request("GET", workload_path)).admitted_pods == 2
        assert len(run["placement"]["pods"]) == 2 and len(env.pods("elastic")) == 2, diagnose()
        assert any(m.startswith("admitted 2 of 4 pods by Kueue") for m in event_messages(env, "elastic",
                                                                                          "AdmittedByKueue"))
        assert progressing(env, "elastic")["message"] == "2 pods running (admitted 2 of 4 pods by Kueue)"

        # The node keeps 6 GPUs free: an elastic job would grow into them; this one may not.
        # The operator resyncs every 2 s (Operator(fast=True)): six looks at the running gang.
        started = time.monotonic()
        wait_until("12 s of samples", lambda: time.monotonic() - started > 12, 20)
        assert sampler.most("elastic") == 2, diagnose()
        assert "ElasticGrow" not in env.event_reasons("elastic")
        assert env.status("elastic")["attempt"] == 0

        # A high-priority 1-GPU job preempts it; queued again, Kueue admits the 1 pod the quota
        # has left, and the new attempt is planned at that size.
        submit(env, "urgent-one", "high", ONE_GPU)
        wait_until("the urgent job Running", running(env, "urgent-one"), 90, diagnose=diagnose)
        again = wait_until("the elastic job Running again, smaller", lambda: (
            env.status("elastic").get("attempt", 0) >= 1 and running(env, "elastic")()), 90, diagnose=diagnose)
        assert len(again["placement"]["pods"]) == 1 and again["restarts"] == 0
        assert any(m.startswith("admitted 1 of 4 pods by Kueue") for m in event_messages(env, "elastic",
                                                                                          "AdmittedByKueue"))
        readmitted = time.monotonic()

        # The urgent job ends and its GPU is free in the quota; the admission stays at 1 pod
        # (Kueue does not grow an admitted Workload), and so does the job.
        for pod in env.pods("urgent-one"):
            env.set_pod_status(pod, "Succeeded", exit_code=0)
        wait_until("the urgent job Succeeded", lambda: env.status("urgent-one").get("phase") == "Succeeded", 60,
                   diagnose=diagnose)
        ended = time.monotonic()
        wait_until("8 s of samples", lambda: time.monotonic() - ended > 8, 20)
        assert sampler.most("elastic", since=readmitted) == 1, diagnose()
        assert env.status("elastic")["attempt"] == again["attempt"] and "ElasticGrow" not in env.event_reasons("elastic")

    # The quota (2 GPUs) held in pods at every sample, terminating pods included.
    samples = sampler.samples
    print(f"\npartial admission: {len(samples)} samples over {samples[-1][0] - samples[0][0]:.0f} s; elastic pods "
          f"at most {sampler.most('elastic')} (at most {sampler.most('elastic', since=readmitted)} after the "
          f"re-admission); GPUs in the namespace's pods at most {sampler.most_gpus()}")
    assert sampler.most_gpus() <= 2, [s for s in samples if s[2] > 2][:5]
    assert len(samples) > 60
