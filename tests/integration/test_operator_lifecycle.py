"""The operator against a real API server: placement, gang admission, restarts, failure, suspend,
progress and garbage collection. The control plane has a scheduler and controller-manager but no
kubelets: nodes are API objects kept Ready by the test, and pod outcomes are written by the test
(operator_env.Kubelet runs bound pods and completes deletions, as a kubelet would)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from operator_env import (
    TINY_MODEL,
    Env,
    Kubelet,
    Operator,
    drop_cluster_rbac,
    restricted_kubeconfig,
    tiny_spec,
    wait_until,
)

pytestmark = pytest.mark.integration

PPO = tiny_spec(
    algorithm="ppo",
    # actor [0,1] + colocated reference, critic [2], reward model [3]: 2 pods of 2 GPUs.
    roles={"actor": {"gpus": 2}, "critic": {"gpus": 1}, "reward": {"gpus": 1, "model": TINY_MODEL},
           "reference": {"colocateWith": "actor"}},
    imagePullPolicy="Never",
    placement={"gpusPerPod": 2, "gangTimeoutSeconds": 30},
)


@pytest.fixture(scope="module")
def env(control_plane, tmp_path_factory):
    e = Env(control_plane.kubeconfig, control_plane.kubectl, prefix="op")
    e.install_crd()
    e.create_namespace()
    for i in range(3):
        e.add_node(f"n{i}", gpus=4, labels={"nvidia.com/gpu.clique": f"c{i}", "topology.kubernetes.io/zone": "z"})
    kubelet = Kubelet(e).start()
    # The operator runs as a ServiceAccount with exactly the rules of rlkube.operator.controller.rbac.
    kubeconfig = restricted_kubeconfig(e, tmp_path_factory.mktemp("operator-rbac"))
    operator = Operator(e, tmp_path_factory.mktemp("operator-logs"), kubeconfig=kubeconfig).start()
    operator.wait_ready()
    e.kubelet, e.operator = kubelet, operator
    yield e
    operator.stop()
    kubelet.stop()
    drop_cluster_rbac(e)
    e.teardown()


@pytest.fixture(autouse=True)
def report_and_clean_up(request, env):
    """On failure print the operator's log; always delete the test's jobs (their GPUs free up)."""
    failed_before = request.session.testsfailed
    before = {j["metadata"]["name"] for j in env.api.list_jobs(env.namespace)}
    yield
    if request.session.testsfailed > failed_before:
        print("\n--- operator log (tail) ---\n" + env.operator.tail(150))
    for job in env.api.list_jobs(env.namespace):
        if job["metadata"]["name"] not in before:
            env.delete_job(job["metadata"]["name"])
    wait_until("the test's pods collected", lambda: not [p for p in env.pods()
               if p["metadata"]["labels"]["rlkube.io/job"] not in before], 60)


def spec(**overrides):
    out = json.loads(json.dumps(PPO))
    for key, value in overrides.items():
        out[key] = {**out.get(key, {}), **value} if isinstance(value, dict) else value
    return out


def phase_is(env: Env, name: str, *phases: str):
    return lambda: env.status(name).get("phase") in phases and env.status(name)


class PodCensus:
    """Watches a job's pods the whole time a test runs: the most pods seen per index at once."""

    def __init__(self, env: Env, job: str) -> None:
        self.env, self.job = env, job
        self.max_per_index = 0
        self.max_total = 0
        self.names: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            pods = self.env.pods(self.job)
            per_index = Counter(p["metadata"]["labels"]["rlkube.io/pod-index"] for p in pods)
            self.max_per_index = max(self.max_per_index, *per_index.values(), 0)
            self.max_total = max(self.max_total, len(pods))
            self.names.update(p["metadata"]["name"] for p in pods)
            self._stop.wait(0.1)


def test_create_places_gated_pods_and_admits_the_gang(env):
    env.create_job("place", spec())
    st = wait_until("phase Running", phase_is(env, "place", "Running"), 60, diagnose=lambda: env.diagnose("place"))
    pods = {p["metadata"]["name"]: p for p in env.pods("place")}
    assert sorted(pods) == ["place-actor-0", "place-critic-1"]
    planned = {p["name"]: p["node"] for p in st["placement"]["pods"]}
    for name, pod in pods.items():
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [planned[name]]
        assert pod["spec"]["nodeName"] == planned[name]          # the real scheduler honoured the plan
        assert not pod["spec"].get("schedulingGates")             # gates removed at admission
        assert pod["metadata"]["labels"]["rlkube.io/attempt"] == "0"
        assert pod["metadata"]["ownerReferences"][0]["uid"] == env.job("place")["metadata"]["uid"]
    # 2+2 GPUs of one job on one 4-GPU node: the tightest domain holds the whole gang.
    assert len(set(planned.values())) == 1
    assert st["observedGeneration"] == 1 and st["restarts"] == 0 and st["gpus"] == 4
    conditions = {c["type"]: c for c in st["conditions"]}
    assert conditions["Placed"]["status"] == conditions["Ready"]["status"] == "True"
    assert st["roles"]["critic"] == {"ranks": [2], "pods": 1, "readyPods": 1, "ready": True}
    wait_until("events", lambda: {"Placed", "Admitted", "Running"} <= set(env.event_reasons("place")), 10)
    svc = env.api.get("Service", env.namespace, "place")
    assert svc["spec"]["clusterIP"] == "None"
    cm = env.api.get("ConfigMap", env.namespace, "place-config")
    assert "deviceMap:" in cm["data"]["run.yaml"]


def test_rank_failure_restarts_the_whole_gang_without_duplicates(env):
    env.create_job("crash", spec())
    wait_until("Running", phase_is(env, "crash", "Running"), 60, diagnose=lambda: env.diagnose("crash"))
    with PodCensus(env, "crash") as census:
        victim = next(p for p in env.pods("crash") if p["metadata"]["name"] == "crash-critic-1")
        env.set_pod_status(victim, "Failed", exit_code=1)

        def restarted():
            st = env.status("crash")
            pods = env.pods("crash")
            return (st.get("phase") == "Running" and st.get("attempt") == 1 and len(pods) == 2
                    and all(p["metadata"]["labels"]["rlkube.io/attempt"] == "1" for p in pods))

        wait_until("the gang running again as attempt 1", restarted, 60, diagnose=lambda: env.diagnose("crash"))
    assert census.max_per_index == 1 and census.max_total <= 2
    assert census.names == {"crash-actor-0", "crash-critic-1"}
    st = env.status("crash")
    assert st["restarts"] == 1
    reasons = env.event_reasons("crash")
    assert "PodFailed" in reasons and reasons.count("Placed") == 2
    env_vars = {e["name"]: e.get("value") for e in env.pods("crash")[0]["spec"]["containers"][0]["env"]}
    assert env_vars["RLKUBE_ATTEMPT"] == "1"


def test_exit_code_in_fail_on_exit_codes_fails_in_one_attempt(env):
    env.create_job("badcfg", spec())
    wait_until("Running", phase_is(env, "badcfg", "Running"), 60, diagnose=lambda: env.diagnose("badcfg"))
    pod = next(p for p in env.pods("badcfg") if p["metadata"]["name"] == "badcfg-actor-0")
    env.set_pod_status(pod, "Failed", exit_code=3)
    st = wait_until("Failed", phase_is(env, "badcfg", "Failed"), 30, diagnose=lambda: env.diagnose("badcfg"))
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ExitCode" and "code 3" in failed["message"]
    assert st["restarts"] == 0 and st["attempt"] == 0 and st.get("completionTime")
    # the other pod is stopped, the failed one is kept for its logs; nothing of attempt 1 appears
    wait_until("the running pod stopped", lambda: [p["metadata"]["name"] for p in env.pods("badcfg")] == ["badcfg-actor-0"], 30)
    assert all(p["metadata"]["labels"]["rlkube.io/attempt"] == "0" for p in env.pods("badcfg"))


def test_suspend_deletes_pods_and_resume_replans(env):
    env.create_job("pause", spec())
    wait_until("Running", phase_is(env, "pause", "Running"), 60, diagnose=lambda: env.diagnose("pause"))
    env.patch_job_spec("pause", {"runPolicy": {"suspend": True}})
    wait_until("Suspended with no pods", lambda: env.status("pause").get("phase") == "Suspended" and not env.pods("pause"),
               30, diagnose=lambda: env.diagnose("pause"))
    st = env.status("pause")
    assert next(c for c in st["conditions"] if c["type"] == "Suspended")["status"] == "True"
    env.patch_job_spec("pause", {"runPolicy": {"suspend": False}})
    wait_until("Running again", lambda: env.status("pause").get("phase") == "Running" and env.status("pause").get("attempt") == 1,
               60, diagnose=lambda: env.diagnose("pause"))
    assert {p["metadata"]["labels"]["rlkube.io/attempt"] for p in env.pods("pause")} == {"1"}
    assert env.status("pause")["restarts"] == 0
    assert {"Suspended", "Resumed"} <= set(env.event_reasons("pause"))


def test_unschedulable_job_waits_pending_until_gpus_appear(env):
    # 20 GPUs in pods of 4, more than the 12 of the three nodes.
    env.create_job("big", spec(roles={"actor": {"gpus": 16}, "critic": {"gpus": 2}, "reward": {"gpus": 2, "model": TINY_MODEL},
                                      "reference": {"colocateWith": "actor"}},
                               placement={"gpusPerPod": 4, "policy": "required"}))
    st = wait_until("Pending/Unschedulable", lambda: (s := env.status("big")).get("phase") == "Pending" and s, 30,
                    diagnose=lambda: env.diagnose("big"))
    placed = next(c for c in st["conditions"] if c["type"] == "Placed")
    assert placed["status"] == "False" and placed["reason"] == "Unschedulable" and placed["message"]
    assert not env.pods("big")
    for i in range(3, 6):
        env.add_node(f"n{i}", gpus=4, labels={"nvidia.com/gpu.clique": "big", "topology.kubernetes.io/zone": "z"})
    wait_until("Running once GPUs appear", phase_is(env, "big", "Running"), 60, diagnose=lambda: env.diagnose("big"))
    # one Event per distinct reason (the reason changes as the three nodes appear), not one per retry
    assert 1 <= env.event_reasons("big").count("Unschedulable") <= 4


def test_progress_of_rank0_is_polled_into_status(env):
    env.create_job("prog", spec())
    wait_until("Running", phase_is(env, "prog", "Running"), 60, diagnose=lambda: env.diagnose("prog"))
    ip = env.kubelet.ip_of("prog-actor-0")
    report = {"phase": "train", "step": 12, "totalSteps": 100, "tokensPerSecond": 2048.5, "mfu": 0.31,
              "gpuUtilization": 0.9, "loss": 0.69, "rewardMean": None}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(report).encode() if self.path == "/progress" else b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    try:
        server = HTTPServer((ip, 8080), Handler)
    except OSError as exc:
        pytest.fail(f"cannot serve the fake rank 0 on {ip}:8080 ({exc}); another process holds *:8080")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        progress = wait_until("status.progress", lambda: env.status("prog").get("progress"), 30,
                              diagnose=lambda: env.diagnose("prog"))
        assert progress["step"] == 12 and progress["totalSteps"] == 100 and progress["mfu"] == 0.31
        assert "rewardMean" not in progress and progress["updatedAt"]
    finally:
        server.shutdown()


def test_operator_never_needed_more_than_its_rbac_rules(env):
    # Every test above ran the operator as a ServiceAccount with exactly rbac.RULES; a missing
    # verb shows up as a 403 in its log.
    assert " 403 " not in env.operator.logs() and "Forbidden" not in env.operator.logs()


def test_deleting_the_job_garbage_collects_its_children(env):
    env.create_job("gone", spec())
    wait_until("Running", phase_is(env, "gone", "Running"), 60, diagnose=lambda: env.diagnose("gone"))
    env.delete_job("gone")
    wait_until("pods, Service and ConfigMap collected", lambda: not env.pods("gone")
               and env.api.get("Service", env.namespace, "gone") is None
               and env.api.get("ConfigMap", env.namespace, "gone-config") is None, 90)
    assert env.job("gone") is None  # no finalizer held it


def test_gang_timeout_replans_when_pods_cannot_bind(env):
    # The scheduler cannot bind a pod asking for more CPU than any node has; the GPU plan itself
    # fits, so the gang is admitted, then re-planned when it has not bound within the timeout.
    env.create_job("stuck", spec(resources={"requests": {"cpu": "100"}}, placement={"gangTimeoutSeconds": 3}))
    wait_until("a GangTimeout re-plan", lambda: "GangTimeout" in env.event_reasons("stuck")
               and env.status("stuck").get("attempt", 0) >= 1, 60, diagnose=lambda: env.diagnose("stuck"))
    assert env.status("stuck")["restarts"] == 0  # re-plans are not failures
    assert all(not p["spec"].get("nodeName") for p in env.pods("stuck"))
    env.delete_job("stuck")
