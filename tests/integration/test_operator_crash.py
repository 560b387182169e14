"""Crash safety: the operator is SIGKILLed at random points while it reconciles jobs whose pods keep
failing, and restarted each time. Afterwards: never two pods of one job index at once, no pod
outside the deterministic names, every job still there, and every job's status converges (all
Running on the current attempt, then all Succeeded) within a bounded time."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from operator_env import Env, Kubelet, Operator, tiny_spec, wait_until

pytestmark = pytest.mark.integration

JOBS = [f"crash{i}" for i in range(8)]
DPO = tiny_spec(2, imagePullPolicy="Never", placement={"gpusPerPod": 1}, runPolicy={"backoffLimit": 1000})
MIN_RECONCILES = 50
MIN_KILLS = 10


class Census(threading.Thread):
    """The most pods seen at once per (job, pod index), and every pod name seen."""

    def __init__(self, env: Env) -> None:
        super().__init__(daemon=True)
        self.env = env
        self.max_per_index = 0
        self.names: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pods = self.env.pods()
            counts = Counter((p["metadata"]["labels"]["rlkube.io/job"], p["metadata"]["labels"]["rlkube.io/pod-index"])
                             for p in pods)
            self.max_per_index = max(self.max_per_index, max(counts.values(), default=0))
            self.names.update(p["metadata"]["name"] for p in pods)
            self.stop.wait(0.1)


class Chaos(threading.Thread):
    """Fails a random running pod (exit code 1, retriable) every `every` seconds."""

    def __init__(self, env: Env, rng: random.Random, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.env, self.rng, self.every = env, rng, every
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            running = [p for p in self.env.pods() if (p.get("status") or {}).get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")]
            if running:
                try:
                    self.env.set_pod_status(self.rng.choice(running), "Failed", exit_code=1)
                    self.failures += 1
                except Exception:
                    pass  # the pod went meanwhile


def reconcile_count(operator: Operator) -> int:
    return operator.logs().count("reconciled ")


def test_sigkill_at_random_points_loses_nothing_and_converges(control_plane, tmp_path):
    rng = random.Random(20261202)
    env = Env(control_plane.kubeconfig, control_plane.kubectl, prefix="crash")
    env.install_crd()
    env.create_namespace()
    for i in range(6):
        env.add_node(f"n{i}", gpus=4, labels={"nvidia.com/gpu.clique": f"c{i // 2}"})
    kubelet = Kubelet(env).start()
    census = Census(env)
    chaos = Chaos(env, rng)
    operator = Operator(env, tmp_path)
    try:
        for name in JOBS:
            env.create_job(name, DPO)
        census.start()
        chaos.start()
        kills = 0
        deadline = time.monotonic() + 240
        while (kills < MIN_KILLS or reconcile_count(operator) < MIN_RECONCILES) and time.monotonic() < deadline:
            operator.start()
            operator.wait_ready(timeout=60)
            # Kill while it works: after its first reconcile, at a random point of the next ones
            # (mid-listing, between a status write and the creates, mid-ungate...).
            wait_until("a first reconcile", lambda: "reconciled " in operator.log_path.read_text(), 60,
                       diagnose=operator.tail)
            time.sleep(rng.uniform(0.0, 3.0))
            operator.kill()
            kills += 1
        reconciles = reconcile_count(operator)
        assert kills >= MIN_KILLS and reconciles >= MIN_RECONCILES, (kills, reconciles)

        # The last start: no more kills, no more failures. Every job must settle.
        chaos.stop.set()
        chaos.join()
        operator.start()
        operator.wait_ready(timeout=60)
        started = time.monotonic()

        def all_running() -> bool:
            for name in JOBS:
                st = env.status(name)
                pods = env.pods(name)
                if st.get("phase") != "Running" or len(pods) != 2:
                    return False
                if any(p["metadata"]["labels"]["rlkube.io/attempt"] != str(st["attempt"]) for p in pods):
                    return False
            return True

        wait_until("every job Running on its current attempt", all_running, 240, interval=0.5,
                   diagnose=lambda: env.diagnose(*JOBS) + "\n" + operator.tail(80))
        converge_seconds = time.monotonic() - started
        for pod in env.pods():
            env.set_pod_status(pod, "Succeeded", exit_code=0)
        wait_until("every job Succeeded", lambda: all(env.status(n).get("phase") == "Succeeded" for n in JOBS), 60,
                   interval=0.5, diagnose=lambda: env.diagnose(*JOBS))
        census.stop.set()
        census.join()

        assert census.max_per_index == 1, "two pods of one job index existed at the same time"
        expected = {f"{name}-actor-{i}" for name in JOBS for i in (0, 1)}
        assert census.names <= expected, census.names - expected
        for name in JOBS:  # 0 lost jobs: all there, all accounted for
            st = env.status(name)
            assert st["attempt"] >= st["restarts"] >= 0
            assert st["observedGeneration"] == 1
        total_restarts = sum(env.status(n)["restarts"] for n in JOBS)
        print(f"\nkills={kills} reconciles={reconciles} injected_failures={chaos.failures} "
              f"restarts={total_restarts} converged_in={converge_seconds:.1f}s")
        assert total_restarts >= 1  # the chaos really made the operator restart gangs
        assert not kubelet.errors, kubelet.errors[:3]
    finally:
        chaos.stop.set()
        census.stop.set()
        operator.stop()
        kubelet.stop()
        env.teardown()
