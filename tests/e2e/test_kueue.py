"""Kueue admits real RLTrainingJobs on real kubelets: quota, FIFO order, preemption (docs/kueue.md).

The chart's operator on the harness's two nodes (2 fake GPUs each, 4 in all), Kueue built from
its Go module and running against the same API server (the `kueue` fixture). A team's
ClusterQueue holds 2 `nvidia.com/gpu`, fewer than the nodes have, so Kueue and not the nodes
limits what runs. A sampler thread (kueue_queues.GpuSampler) reads the ClusterQueue, the
Workloads, the pods and the jobs every half second for the whole test.

- Three 2-GPU DPO jobs in the queue run one at a time in the order their Workloads were made,
  none restarting; an unlabelled job in a namespace Kueue does not manage runs meanwhile on the
  GPUs the quota leaves, as it would without Kueue.
- A higher-priority job preempts a running one: the preempted job is suspended (Pending,
  EvictedByKueue; never Failed, no restart counted), resumes from its checkpoint once the
  urgent job is done, and loses at most its checkpoint interval of steps.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from rlkube.operator.render import kueue_workload as kw
from tests.cluster import bins, procs
from tests.e2e import deploy
from tests.e2e.kueue_queues import GpuSampler, TeamQueues, admitted, running, succeeded

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NAMESPACE = "rlkube-e2e-kueue"
TWO_GPUS = {"roles": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
            "placement": {"gpusPerPod": 2}}
STEP_LINE = re.compile(r'"event": ?"step", ?"step": ?(\d+)')
# The preempted job: long enough to be caught mid-run, checkpointing every EVERY steps. A step of
# the CPU stub takes ~0.15 s here and the eviction reaches the pod some 20 s after the job's
# progress first shows step 2 (progress is read every 10 s, then Kueue, then the operator's poll):
# with 160 steps the first green run (2026-12-04) caught it at step 151 of 160, too close.
PREEMPTED_STEPS, EVERY = 400, 10


@pytest.fixture(scope="module")
def queues(deployed, kueue, request):
    cluster = deployed.cluster
    deploy.ensure_namespace(cluster, NAMESPACE)
    team = TeamQueues(cluster.api, NAMESPACE, gpus=2)
    team.create()
    request.node.rlkube_kueue = team
    yield team
    cluster.kubectl("delete", "rltj", "--all", "-n", NAMESPACE, "--wait=true", timeout=180, check=False)
    deploy.wait_until("the Workloads collected with their jobs", lambda: not team.workloads(), 120)
    team.delete()
    cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture(autouse=True)
def kueue_state_on_failure(request, deployed, queues):
    """On failure: Kueue's log and the namespace's Workloads (the operator's side is added by
    conftest's report hook)."""
    request.node.rlkube_namespaces = [NAMESPACE]
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print("\n--- kueue log (tail) ---\n" + procs.log_tail(deployed.cluster.layout.state, "kueue", 60))
        print("\n--- workloads ---\n" + deployed.cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", NAMESPACE,
                                                              "-o", "yaml", check=False))


def queued_job(deployed, queues: TeamQueues, prefix: str, priority: str | None = None, **spec) -> tuple[str, dict]:
    name = deployed.job_name(prefix)
    job = deploy.job_manifest(name, NAMESPACE, **{**TWO_GPUS, **spec})
    job["metadata"]["labels"] = {kw.QUEUE_LABEL: queues.local_queue}
    if priority:
        job["spec"]["priorityClassName"] = queues.priorities[priority][0]
    return name, job


def submit_in_order(cluster, queues: TeamQueues, name: str, job: dict) -> None:
    """Apply the job and wait for its Workload, so Workloads are made in submission order."""
    deploy.apply(cluster, job)
    deploy.wait_until(f"the Workload of {name}", lambda: any(
        w["metadata"]["name"] == kw.workload_name(name) for w in queues.workloads()), 60)


def test_quota_of_two_gpus_runs_three_jobs_one_at_a_time_in_kueue_order(deployed, queues):
    cluster = deployed.cluster
    jobs = [queued_job(deployed, queues, f"kq{i}") for i in range(3)]
    names = [n for n, _ in jobs]
    free = deployed.job_name("nokueue")  # no label, in a namespace no ClusterQueue selects
    free_job = deploy.job_manifest(free, deployed.jobs_namespace, **TWO_GPUS)
    with GpuSampler(cluster.api, queues, (NAMESPACE, deployed.jobs_namespace)) as sampler:
        for name, job in jobs:
            submit_in_order(cluster, queues, name, job)
        deploy.apply(cluster, free_job)
        for name in [*names, free]:
            ns = deployed.jobs_namespace if name == free else NAMESPACE
            deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
    deploy.log(f"kueue e2e (3 jobs): {sampler.summary()}")

    # Never more than the quota: neither reserved by Kueue nor held by the queue's pods; and the
    # quota was used (a test that never admitted anything would pass the first two).
    assert max(s.gpus_reserved for s in sampler.samples) == 2, sampler.summary()
    assert max(s.gpus_in_pods for s in sampler.samples) == 2, sampler.summary()
    assert all(len(s.admitted) <= 1 for s in sampler.samples), [s.admitted for s in sampler.samples if s.admitted]

    # Kueue's order (StrictFIFO: the order the Workloads were made) for admission and for the end.
    workloads = sorted(queues.workloads(), key=lambda w: w["metadata"]["creationTimestamp"])
    made = [w["metadata"]["labels"][kw.LABEL_JOB] for w in workloads]
    assert made == names, made
    admitted_at = [sampler.first(n, admitted) for n in names]
    done_at = [sampler.first(n, succeeded) for n in names]
    deploy.log(f"admitted at {admitted_at} s, succeeded at {done_at} s")
    assert None not in admitted_at and admitted_at == sorted(admitted_at), admitted_at
    assert None not in done_at and done_at == sorted(done_at), done_at
    for before, after in zip(done_at, admitted_at[1:], strict=False):
        assert after >= before, (admitted_at, done_at)  # the next waits for the quota to come back

    for name in names:
        job = deploy.get_job(cluster, NAMESPACE, name)
        assert job["status"]["restarts"] == 0 and job["status"].get("attempt", 0) == 0, job["status"]
        assert job["status"]["progress"]["step"] == job["spec"]["training"]["steps"]
        assert "Failed" not in sampler.phases_of(name), sampler.phases_of(name)
        reasons = [e["reason"] for e in deploy.events(cluster, NAMESPACE, name)]
        assert reasons.index("Queued") < reasons.index("AdmittedByKueue") < reasons.index("Succeeded"), reasons
    # Each Workload ends Finished (the quota released for good); the operator writes that after the
    # job's Succeeded, so the last one may lag the sampler's end by a moment (seen on kind under load).
    deadline = time.monotonic() + 60
    while True:
        now = {w["metadata"]["labels"][kw.LABEL_JOB]: w for w in queues.workloads()}
        unfinished = [n for n in names if not kw.observe_workload(now[n]).finished]
        if not unfinished or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not unfinished, f"Workloads not Finished 60 s after their jobs Succeeded: {unfinished}"
    for name in names[1:]:  # the later two waited visibly for quota
        assert sampler.first(name, lambda j, s: s.phases.get(j) == ("Pending", "QueuedInKueue")) is not None

    # The unlabelled job ran as today: no Workload, no queue events, and it ran while the queue's
    # quota was taken.
    free_done = deploy.get_job(cluster, deployed.jobs_namespace, free)
    assert free_done["status"]["restarts"] == 0
    assert not cluster.api.get(f"{kw_path(deployed.jobs_namespace)}")["items"]
    free_reasons = [e["reason"] for e in deploy.events(cluster, deployed.jobs_namespace, free)]
    assert "Queued" not in free_reasons and "AdmittedByKueue" not in free_reasons, free_reasons
    assert any(running(free, s) and s.gpus_reserved == 2 for s in sampler.samples), "never ran beside the queue"
    deploy.delete_job(cluster, deployed.jobs_namespace, free)


def kw_path(namespace: str) -> str:
    return f"/apis/{kw.GROUP}/{kw.VERSION}/namespaces/{namespace}/workloads"


class LogFollower:
    """`kubectl logs -f` of one pod into a file: what a pod printed up to its end, even after the
    operator deleted it."""

    def __init__(self, cluster, pod: str, path: Path) -> None:
        self.path = path
        self.out = path.open("w")
        self.proc = subprocess.Popen([str(bins.kubectl()), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
                                      "-n", NAMESPACE, pod], stdout=self.out, stderr=subprocess.STDOUT)

    def text(self, timeout: float = 60) -> str:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.out.close()
        return self.path.read_text()


def test_preempted_job_is_suspended_and_resumes_from_its_checkpoint(deployed, queues, tmp_path):
    cluster = deployed.cluster
    low, low_job = queued_job(deployed, queues, "kqlow", "low", training={"steps": PREEMPTED_STEPS},
                              checkpoint={"everySteps": EVERY, "keep": 2},
                              data={"numSamples": 1024, "maxSeqLen": 128},
                              batching={"globalBatch": 16, "maxTokensPerGpu": 4096})
    urgent, urgent_job = queued_job(deployed, queues, "kqurgent", "high")
    with GpuSampler(cluster.api, queues, (NAMESPACE,)) as sampler:
        submit_in_order(cluster, queues, low, low_job)
        deploy.wait_job(cluster, NAMESPACE, low, lambda j: deploy.step(j) >= 2, "step >= 2", timeout=300)
        follower = LogFollower(cluster, deploy.rank0_pod(cluster, NAMESPACE, low)["metadata"]["name"],
                               tmp_path / "attempt0.log")
        deploy.wait_job(cluster, NAMESPACE, low, lambda j: deploy.step(j) >= EVERY + 2, f"step >= {EVERY + 2}",
                        timeout=300)
        submit_in_order(cluster, queues, urgent, urgent_job)

        evicted = deploy.wait_job(cluster, NAMESPACE, low, lambda j: progressing(j).get("reason") == "EvictedByKueue",
                                  "evicted by Kueue", timeout=120)
        attempt0 = follower.text()
        deploy.wait_phase(cluster, NAMESPACE, urgent, "Succeeded", timeout=300)
        done = deploy.wait_phase(cluster, NAMESPACE, low, "Succeeded", timeout=600)
    deploy.log(f"kueue e2e (preemption): {sampler.summary()}")

    # Suspended, not failed: Pending while evicted, one new attempt, no restart counted.
    assert evicted["status"]["phase"] == "Pending", evicted["status"]
    assert "Failed" not in sampler.phases_of(low), sampler.phases_of(low)
    assert done["status"]["restarts"] == 0 and done["status"]["attempt"] == 1, done["status"]
    assert done["status"]["progress"]["step"] == PREEMPTED_STEPS
    reasons = [e["reason"] for e in deploy.events(cluster, NAMESPACE, low)]
    assert {"Queued", "AdmittedByKueue", "Evicted", "Succeeded"} <= set(reasons), reasons
    held = [admitted(low, s) for s in sampler.samples if low in s.phases]
    held = [h for i, h in enumerate(held) if i == 0 or h != held[i - 1]]
    assert held[:3] == [True, False, True] or held[:4] == [False, True, False, True], held  # admitted twice

    # The urgent job ran between the two admissions of the preempted one, and GPUs never
    # exceeded the quota, terminating pods included.
    assert max(s.gpus_reserved for s in sampler.samples) == 2, sampler.summary()
    assert max(s.gpus_in_pods for s in sampler.samples) == 2, sampler.summary()
    urgent_admitted = sampler.first(urgent, admitted)
    low_back = next((s.at for s in sampler.samples if s.at > (urgent_admitted or 0) and admitted(low, s)), None)
    assert urgent_admitted is not None and low_back is not None
    assert sampler.first(urgent, succeeded) <= low_back, (sampler.first(urgent, succeeded), low_back)

    # Resumed from its checkpoint, losing at most EVERY steps: the last step attempt 0 printed
    # against the step attempt 1 resumed at (both from the trainers' own logs).
    reached = max(int(s) for s in STEP_LINE.findall(attempt0))
    resumed = deploy.resumed_step(cluster, NAMESPACE, low)
    deploy.log(f"preempted at step {reached}, resumed at step {resumed}; {attempt0.strip().splitlines()[-1]}")
    assert resumed is not None, "the re-admitted attempt started afresh instead of from the checkpoint"
    assert 0 <= reached - resumed <= EVERY, (reached, resumed)
    assert reached > EVERY  # caught mid-run, past its first periodic checkpoint


def progressing(job: dict) -> dict:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "Progressing"), {})

