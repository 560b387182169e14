"""The chaos soak's faults: a seeded schedule, the four ways it breaks the cluster, and the
restore that always runs afterwards.

Every fault strikes while a job trains (rank 0 logged a step in the last 20 s, short of its last
step): the driver waits for one, applying a job still to come when none trains, and records what
trained at the moment of each fault for the landing check (verdict.landing).

Kinds (each a real act on the harness's processes, nothing mocked):
- `kill-trainer`: a random training pod of the soak, mid-run, either its container SIGKILLed through
  its node's containerd (a crash: no checkpoint on the way out) or the pod deleted (SIGTERM: the
  trainer checkpoints, then exits); the operator restarts the gang.
- `kill-operator`: the operator's container SIGKILLed through containerd (the kubelet restarts
  it), or its pod force-deleted (the Deployment makes another; the Lease keeps one leader).
- `stop-kubelet`: the kubelet of a node where a job trains SIGSTOPped for a short while (under the node controller's
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
from tests.soak.verdict import Fault, Training

KINDS = ("kill-trainer", "kill-operator", "stop-kubelet", "restart-apiserver")
SHORT_STOP = (15.0, 30.0)  # s: below the node controller's 50 s grace
LONG_STOP = (75.0, 95.0)  # s: past it (plus the operator's 5 s): the node is lost
APISERVER_DOWN = (3.0, 15.0)
EVERY_MARGIN = 5  # a trainer is killed at least this many steps before its job's end (soak.EVERY)
TRAINING_WAIT_S = 180.0  # how long a fault waits for a job to train (a fed job must start first)


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
        # The pods training now (soak.py: from the pod watch and rank 0's logs), and what applies
        # a job still to come when a fault finds none (soak.Arrivals.apply_next).
        self.training: Callable[[], list[Training]] = list
        self.feed: Callable[[], bool] = lambda: False

    def run(self, plan: list[Planned], opened: float, stop: threading.Event) -> None:
        for item in plan:
            if stop.wait(max(0.0, opened + item.at - time.monotonic())):
                return
            try:
                if not self._await_training(item, stop):
                    continue
                getattr(self, item.kind.replace("-", "_"))(item)
            except subprocess.CalledProcessError as err:
                # Seen: a trainer's container exited between the listing and `ctr tasks kill`. The
                # soak goes on; the fault counts as not landed (the landing check fails).
                self.skipped.append(f"{time.strftime('%H:%M:%S')} {item.kind}: {err}"[:300])
                deploy.log(f"fault {item.kind} did not land: {err}")

    def _await_training(self, item: Planned, stop: threading.Event) -> bool:
        """Wait (bounded) until a job trains, for a trainer kill one short of its last checkpoint
        interval. When none does (every job applied so far has finished, or is between
        attempts), a job still to come is applied, once per wait, and the fault waits for it to
        train: the fault's clock stops meanwhile, and later faults follow at their times or at
        once when overdue. A fault that finds nothing to strike is skipped, and the landing check
        fails the soak."""
        deadline, fed = time.monotonic() + TRAINING_WAIT_S, False
        while time.monotonic() < deadline and not stop.is_set():
            if self._targets(item, self.training()):
                return True
            if not fed and not self.training():
                fed = self.feed()
            stop.wait(1.0)
        self.skipped.append(f"{time.strftime('%H:%M:%S')} {item.kind}: no job training within {TRAINING_WAIT_S:.0f} s")
        deploy.log(f"fault {item.kind} skipped: no job training")
        return False

    @staticmethod
    def _targets(item: Planned, training: list[Training]) -> list[Training]:
        if item.kind == "kill-trainer":  # mid-run: a checkpoint interval or more before its end
            return [t for t in training if t.step + EVERY_MARGIN <= t.total]
        return training

    def _done(self, kind: str, start: float, target: str, detail: str, recovered: float | None = None,
              training: list[Training] | None = None) -> None:
        seen = tuple(t.describe() for t in (training or []))
        self.faults.append(Fault(kind, start, time.time(), target, detail, seen))
        if recovered is not None:
            self.recoveries.setdefault(kind, []).append(round(recovered, 1))
        deploy.log(f"fault {kind}: {target} {detail}" + (f" (recovered in {recovered:.1f} s)" if recovered else ""))

    # -- the four kinds ----------------------------------------------------------------------------

    def kill_trainer(self, item: Planned) -> None:
        """A training pod (chosen by the seed) killed mid-run. Its container ID comes from a fresh
        listing; a container that exited in between (seen) makes the driver choose again, once."""
        for last_try in (False, True):
            training = self.training()
            targets = self._targets(item, training)
            if not targets:
                raise subprocess.CalledProcessError(1, "kill-trainer: no pod training any more")
            chosen = self.rng.choice(targets)
            pod = next((p for p in self._trainer_pods() if p["metadata"]["name"] == chosen.pod), None)
            container = _running_container(pod) if pod else ""
            if not container:
                if last_try:
                    raise subprocess.CalledProcessError(1, f"kill-trainer: {chosen.pod} has no running container")
                continue
            start = time.time()
            try:
                if item.variant == "sigkill":
                    self._ctr_kill(pod, container)
                else:
                    self.cluster.kubectl("delete", "pod", "-n", self.namespace, chosen.pod, "--wait=false")
            except subprocess.CalledProcessError:
                if last_try:
                    raise
                continue
            self._done(item.kind, start, f"{self.namespace}/{chosen.pod}", f"{item.variant} on {chosen.node}",
                       training=training)
            return

    def kill_operator(self, item: Planned) -> None:
        pod = deploy.wait_operator_ready(self.cluster)
        training = self.training()
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
        self._done(item.kind, start, name, item.variant, time.monotonic() - t0, training)

    def stop_kubelet(self, item: Planned) -> None:
        training = self.training()
        busy = {t.node for t in training}
        candidates = [n for n in self.cluster.nodes if n.name in busy]
        if not candidates:
            raise subprocess.CalledProcessError(1, "stop-kubelet: no node runs a training pod any more")
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
        self._done(item.kind, start, node.name, f"{item.variant}, stopped {item.seconds:.0f} s", time.monotonic() - t0,
                   training)

    def restart_apiserver(self, item: Planned) -> None:
        training = self.training()
        layout, start = self.cluster.layout, time.time()
        procs.stop(layout.state, controlplane.APISERVER)
        time.sleep(item.seconds)
        t0 = time.monotonic()
        controlplane.start_apiserver(layout)
        client = controlplane.admin_client(layout, timeout=5)
        deploy.wait_until("kube-apiserver /readyz", lambda: client.healthy("/readyz"), 180, interval=0.5)
        self._done(item.kind, start, "kube-apiserver", f"down {item.seconds:.0f} s", time.monotonic() - t0, training)

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
