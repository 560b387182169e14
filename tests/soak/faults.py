"""The chaos soak's faults: a seeded schedule, the four ways it breaks the cluster, and the
restore that always runs afterwards.

Kinds (each a real act on the harness's processes, nothing mocked):
- `kill-trainer`: a random running trainer pod of the soak, either its container SIGKILLed through
  its node's containerd (a crash: no checkpoint on the way out) or the pod deleted (SIGTERM: the
  trainer checkpoints, then exits); the operator restarts the gang.
- `kill-operator`: the operator's container SIGKILLed through containerd (the kubelet restarts
  it), or its pod force-deleted (the Deployment makes another; the Lease keeps one leader).
- `stop-kubelet`: a node's kubelet SIGSTOPped for a short while (under the node controller's
  50 s grace: nothing should happen) or a long one (past it and the operator's 5 s: the node is
  lost and its jobs re-planned), then SIGCONTed.
- `restart-apiserver`: kube-apiserver stopped (SIGTERM), left down a few seconds, started again
  with the same flags.

`restore` SIGCONTs every kubelet and starts the API server when it is not running, so the cluster
is left as the e2e suite expects it whatever happened.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.cluster import controlplane, procs
from tests.cluster import nodes as cluster_nodes
from tests.e2e import deploy
from tests.soak.verdict import Fault

KINDS = ("kill-trainer", "kill-operator", "stop-kubelet", "restart-apiserver")
SHORT_STOP = (15.0, 30.0)  # s: below the node controller's 50 s grace
LONG_STOP = (75.0, 95.0)  # s: past it (plus the operator's 5 s): the node is lost
APISERVER_DOWN = (3.0, 15.0)
TRAINER_WAIT_S = 60.0  # how long kill-trainer waits for a running trainer before it is skipped


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the fault window opens
    kind: str
    variant: str
    seconds: float = 0.0  # how long a stop or an outage lasts


def schedule(seed: int, faults: int, duration: float) -> list[Planned]:
    """`faults` faults at seeded random times within `duration` seconds; every kind appears once
    before any appears twice (a shuffled round of the kinds, again and again)."""
    rng = random.Random(seed)
    kinds: list[str] = []
    while len(kinds) < faults:
        round_ = list(KINDS)
        rng.shuffle(round_)
        kinds += round_
    times = sorted(rng.uniform(0, duration) for _ in range(faults))
    plan = []
    for at, kind in zip(times, kinds[:faults], strict=True):
        if kind == "kill-trainer":
            plan.append(Planned(at, kind, rng.choice(("sigkill", "delete"))))
        elif kind == "kill-operator":
            plan.append(Planned(at, kind, rng.choice(("sigkill", "force-delete"))))
        elif kind == "stop-kubelet":
            variant = rng.choice(("short", "long"))
            plan.append(Planned(at, kind, variant, rng.uniform(*(SHORT_STOP if variant == "short" else LONG_STOP))))
        else:
            plan.append(Planned(at, kind, "", rng.uniform(*APISERVER_DOWN)))
    return plan


@dataclass
class Kubelets:
    """Which kubelets the driver stopped and when each was resumed (for the duplicate rule)."""

    cluster: object
    stopped: dict[str, float] = field(default_factory=dict)  # node -> SIGSTOP time
    resumed: dict[str, float] = field(default_factory=dict)  # node -> last SIGCONT time
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pid(self, node) -> int:
        pid = procs.read_pid(self.cluster.layout.state, cluster_nodes.kubelet_name(node))
        if not pid or not procs.alive(pid):
            raise RuntimeError(f"the kubelet of {node.name} is not running")
        return pid

    def stop(self, node) -> None:
        with self.lock:
            os.kill(self.pid(node), signal.SIGSTOP)
            self.stopped[node.name] = time.time()

    def resume(self, node) -> None:
        with self.lock:
            os.kill(self.pid(node), signal.SIGCONT)
            self.stopped.pop(node.name, None)
            self.resumed[node.name] = time.time()

    def partition_state(self) -> tuple[dict[str, float], dict[str, float]]:
        with self.lock:
            return dict(self.stopped), dict(self.resumed)


class Driver:
    """Runs a schedule against the cluster; `faults` is what was done, `recoveries` how long each
    component took to serve again (seconds, by kind)."""

    def __init__(self, cluster, namespace: str, seed: int) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.rng = random.Random(seed + 1)  # targets: separate from the schedule's draws
        self.kubelets = Kubelets(cluster)
        self.faults: list[Fault] = []
        self.skipped: list[str] = []
        self.recoveries: dict[str, list[float]] = {}
        # Called when a trainer kill finds no trainer running: applies a job still to come (soak.py).
        self.no_trainer: Callable[[], bool] = lambda: False

    def run(self, plan: list[Planned], opened: float, stop: threading.Event) -> None:
        for item in plan:
            if stop.wait(max(0.0, opened + item.at - time.monotonic())):
                return
            try:
                getattr(self, item.kind.replace("-", "_"))(item)
            except subprocess.CalledProcessError as err:
                # Seen: a trainer's container exited between the listing and `ctr tasks kill`. The
                # soak goes on; the fault counts as not landed (the check on trainer kills fails).
                self.skipped.append(f"{time.strftime('%H:%M:%S')} {item.kind}: {err}"[:300])
                deploy.log(f"fault {item.kind} did not land: {err}")

    def _done(self, kind: str, start: float, target: str, detail: str, recovered: float | None = None) -> None:
        self.faults.append(Fault(kind, start, time.time(), target, detail))
        if recovered is not None:
            self.recoveries.setdefault(kind, []).append(round(recovered, 1))
        deploy.log(f"fault {kind}: {target} {detail}" + (f" (recovered in {recovered:.1f} s)" if recovered else ""))

    # -- the four kinds ----------------------------------------------------------------------------

    def kill_trainer(self, item: Planned) -> None:
        # Wait (bounded) for a trainer to run: a gang may be between attempts right now.
        running: list[dict] = []
        deadline = time.monotonic() + TRAINER_WAIT_S
        early = False
        while not running and time.monotonic() < deadline:
            running = [p for p in self._trainer_pods() if _running_container(p)]
            if not running:
                early = early or self.no_trainer()
                time.sleep(2)
        if not running:
            self.skipped.append(f"{time.strftime('%H:%M:%S')} kill-trainer: no running trainer pod")
            deploy.log("fault kill-trainer skipped: no running trainer pod")
            return
        pod = self.rng.choice(sorted(running, key=lambda p: p["metadata"]["name"]))
        name, start = pod["metadata"]["name"], time.time()
        if item.variant == "sigkill":
            try:
                self._ctr_kill(pod, _running_container(pod))
            except subprocess.CalledProcessError:
                running = [p for p in self._trainer_pods() if _running_container(p)]
                if not running:
                    raise
                pod = self.rng.choice(sorted(running, key=lambda p: p["metadata"]["name"]))  # once more
                name, start = pod["metadata"]["name"], time.time()
                self._ctr_kill(pod, _running_container(pod))
        else:
            self.cluster.kubectl("delete", "pod", "-n", self.namespace, name, "--wait=false")
        self._done(item.kind, start, f"{self.namespace}/{name}", f"{item.variant} on {pod['spec']['nodeName']}")

    def kill_operator(self, item: Planned) -> None:
        pod = deploy.wait_operator_ready(self.cluster)
        name, start, t0 = pod["metadata"]["name"], time.time(), time.monotonic()
        if item.variant == "sigkill":
            pod = self._kill_operator_container(pod)
            name, start, t0 = pod["metadata"]["name"], time.time(), time.monotonic()
        else:
            self.cluster.kubectl("delete", "pod", "-n", deploy.OPERATOR_NAMESPACE, name,
                                 "--grace-period=0", "--force", "--wait=false")
        before = (pod["metadata"]["uid"], _restarts(pod))

        def replaced() -> bool:  # Ready again, as a new pod or a restarted container
            ready = deploy.wait_operator_ready(self.cluster, timeout=300)
            return (ready["metadata"]["uid"], _restarts(ready)) != before

        deploy.wait_until("the operator replaced and Ready", replaced, 300, interval=0.5)
        self._done(item.kind, start, name, item.variant, time.monotonic() - t0)

    def stop_kubelet(self, item: Planned) -> None:
        busy = {p["spec"].get("nodeName") for p in self._trainer_pods() if _running_container(p)}
        candidates = [n for n in self.cluster.nodes if n.name in busy] or list(self.cluster.nodes)
        node = self.rng.choice(candidates)
        start = time.time()
        self.kubelets.stop(node)
        deploy.log(f"fault stop-kubelet: {node.name} stopped for {item.seconds:.0f} s ({item.variant})")
        try:
            time.sleep(item.seconds)
        finally:
            self.kubelets.resume(node)
        t0 = time.monotonic()
        deploy.wait_until(f"node {node.name} Ready again", lambda: node_ready(self.cluster, node.name), 180)
        self._done(item.kind, start, node.name, f"{item.variant}, stopped {item.seconds:.0f} s", time.monotonic() - t0)

    def restart_apiserver(self, item: Planned) -> None:
        layout, start = self.cluster.layout, time.time()
        procs.stop(layout.state, controlplane.APISERVER)
        time.sleep(item.seconds)
        t0 = time.monotonic()
        controlplane.start_apiserver(layout)
        client = controlplane.admin_client(layout, timeout=5)
        deploy.wait_until("kube-apiserver /readyz", lambda: client.healthy("/readyz"), 180, interval=0.5)
        self._done(item.kind, start, "kube-apiserver", f"down {item.seconds:.0f} s", time.monotonic() - t0)

    # -- helpers -------------------------------------------------------------------------------------

    def _kill_operator_container(self, pod: dict) -> dict:
        """SIGKILL the operator's running container; returns the pod it was in. Seen (07:02): the
        operator had just exited on its own (its Lease lost to an API-server restart a moment
        before), its pod still Ready, its container gone, so `ctr tasks kill` failed. Then the
        next running container is killed, once the pod is Ready with one (bounded)."""
        tried: set[str] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            container = _running_container(pod)
            if container and container not in tried:
                try:
                    self._ctr_kill(pod, container)
                    return pod
                except subprocess.CalledProcessError:
                    tried.add(container)
            time.sleep(1)
            pod = deploy.wait_operator_ready(self.cluster, timeout=300)
        raise subprocess.CalledProcessError(1, f"ctr tasks kill: no running operator container but {sorted(tried)}")

    def _trainer_pods(self) -> list[dict]:
        out = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", "rlkube.io/pod-index", "-o", "json")
        return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]

    def _ctr_kill(self, pod: dict, container_id: str) -> None:
        (node,) = [n for n in self.cluster.nodes if n.name == pod["spec"]["nodeName"]]
        cluster_nodes.ctr(self.cluster.layout, node, "tasks", "kill", "--signal", "SIGKILL", container_id)


def _running_container(pod: dict) -> str:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("state", {}).get("running") and status.get("containerID"):
            return status["containerID"].split("://", 1)[1]
    return ""


def _restarts(pod: dict) -> int:
    return sum(s.get("restartCount", 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def node_ready(cluster, name: str) -> bool:
    obj = json.loads(cluster.kubectl("get", "node", name, "-o", "json"))
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"].get("conditions", []))


def restore(cluster) -> list[str]:
    """Every kubelet resumed, the API server running, both nodes Ready, the operator Ready: the
    cluster as the e2e suite expects it. Returns what it had to repair."""
    repaired = []
    for node in cluster.nodes:
        pid = procs.read_pid(cluster.layout.state, cluster_nodes.kubelet_name(node))
        if pid and procs.alive(pid):
            state = _proc_state(pid)
            os.kill(pid, signal.SIGCONT)
            if state == "T":
                repaired.append(f"kubelet of {node.name} resumed")
    if not procs.running(cluster.layout.state, controlplane.APISERVER):
        controlplane.start_apiserver(cluster.layout)
        repaired.append("kube-apiserver started")
    client = controlplane.admin_client(cluster.layout, timeout=5)
    deploy.wait_until("kube-apiserver /readyz", lambda: client.healthy("/readyz"), 180, interval=0.5)
    for node in cluster.nodes:
        deploy.wait_until(f"node {node.name} Ready", lambda n=node: node_ready(cluster, n.name), 180, interval=2)
    deploy.wait_operator_ready(cluster, timeout=300)
    return repaired


def _proc_state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return "?"
