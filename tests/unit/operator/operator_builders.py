"""Small builders of job, pod and node objects (camelCase dicts, as the API server returns them)
for the operator's pure tests, plus a tiny in-memory world that applies a Decision the way the
reconciler does."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import JobView, pod_views
from rlkube.operator.controller.reconcile import final_report
from rlkube.operator.planning.cluster import Cluster, cluster_view
from rlkube.operator.render.status import status_patch
from tests.sections import with_sections

T0 = dt.datetime(2026, 12, 2, 12, 0, 0, tzinfo=dt.timezone.utc)
UID = "0000-job-uid"

TINY_MODEL = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259}}
REWARD_MODEL = {"path": "/models/reward"}  # a reward role needs a model or a function
ROLES = {
    "dpo": {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}},
    "ppo": {"actor": {"gpus": 2}, "critic": {"gpus": 1}, "reward": {"gpus": 1, "model": REWARD_MODEL},
            "reference": {"colocateWith": "actor"}},
}


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def spec(algorithm: str = "ppo", gpus_per_pod: int = 1, **overrides: Any) -> dict:
    out: dict[str, Any] = {
        "algorithm": algorithm,
        "model": copy.deepcopy(TINY_MODEL),
        "roles": copy.deepcopy(ROLES[algorithm]),
        "data": {"source": "synthetic", "format": "synthetic"},
        "image": "localhost/rlkube/runtime-cpu:dev",
        "imagePullPolicy": "Never",
        "placement": {"gpusPerPod": gpus_per_pod},
    }
    return with_sections(out, overrides)


def job(name: str = "tiny", status: dict | None = None, labels: dict | None = None, generation: int = 1,
        **spec_overrides: Any) -> dict:
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name, "namespace": "team", "uid": UID, "generation": generation,
                     "resourceVersion": "100", "labels": dict(labels or {})},
        "spec": spec(**spec_overrides),
        **({"status": copy.deepcopy(status)} if status is not None else {}),
    }


def node(name: str, gpus: int = 4, ready: bool = True, labels: dict | None = None, **spec: Any) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": dict(spec),
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def cluster(nodes: list[dict], pods: list[dict] = (), job_spec: Any = None) -> Cluster:
    from rlkube.operator.api import parse_spec

    return cluster_view(list(nodes), list(pods), job_spec or parse_spec(spec()))


def with_status(pod: dict, phase: str, *, node_name: str | None = None, exit_code: int | None = None,
                ready: bool | None = None, reason: str | None = None, disrupted: bool = False,
                ip: str | None = None, message: str | None = None) -> dict:
    """A copy of `pod` as a kubelet would report it."""
    pod = {**pod, "metadata": copy.deepcopy(pod["metadata"]), "spec": {**pod["spec"]}}  # spec is shared below
    if node_name:
        pod["spec"]["nodeName"] = node_name
        pod["spec"].pop("schedulingGates", None)
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if ready is not None:
        status["conditions"].append({"type": "Ready", "status": "True" if ready else "False"})
    if disrupted:
        status["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
    if reason:
        status["reason"] = reason
    if exit_code is not None:
        terminated = {"exitCode": exit_code, **({"message": message} if message is not None else {})}
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    elif phase == "Running":
        status["containerStatuses"] = [{"name": "trainer", "state": {"running": {}}}]
    if ip:
        status["podIP"] = ip
    pod["status"] = status
    return pod


class World:
    """A job and its pods in memory; `step()` decides and applies like reconcile.Reconciler."""

    def __init__(self, job_obj: dict, nodes: list[dict], settings: lifecycle.Settings = lifecycle.Settings()):
        self.job = job_obj
        self.nodes = nodes
        self.pods: dict[str, dict] = {}
        self.other_pods: list[dict] = []
        # The node-wide listing of bound pods the next steps see (None: a fresh one each step).
        # The reconciler's is cached for a few seconds; its own pods it always lists fresh.
        self.listing: list[dict] | None = None
        self.events: list[lifecycle.Event] = []
        self.settings = settings
        self.deleted_job = False
        self.writes = 0
        self.created_total = 0

    def bound(self) -> list[dict]:
        """A fresh listing of the pods bound to nodes (the job's and other workloads')."""
        return [p for p in [*self.pods.values(), *self.other_pods] if p["spec"].get("nodeName")]

    def view(self) -> JobView:
        return JobView.from_object(self.job)

    def step(self, now: dt.datetime, progress: dict | None = None, crash_after: int | None = None) -> lifecycle.Decision:
        """Decide and apply; `crash_after=k`: the operator dies after the status write and k of
        the decision's API calls (deletes, force deletes, creates, ungates, in the reconciler's order)."""
        view = self.view()
        pods = pod_views(list(self.pods.values()))
        progress = progress or final_report(view, pods)  # as the Reconciler does
        decision = lifecycle.decide(view, pods, now, None, progress, self.settings)
        if decision.need_cluster:
            bound = self.listing if self.listing is not None else self.bound()
            cluster = cluster_view(self.nodes, bound, view.spec, own_uid=view.ref.uid,
                                   own_pods=list(self.pods.values()))
            decision = lifecycle.decide(view, pods, now, cluster, progress, self.settings)
        patch = status_patch(view.status, decision.status)
        if patch:
            self.writes += 1
            self.job["status"] = decision.status
            self.job["metadata"]["resourceVersion"] = str(int(self.job["metadata"]["resourceVersion"]) + 1)
        calls: list = [("delete", n) for n in decision.delete] + [("delete", n) for n in decision.force_delete] \
            + [("create", o) for o in decision.create] + [("ungate", g) for g in decision.ungate]
        if crash_after is not None:
            calls = calls[:crash_after]
        for kind, arg in calls:
            if kind == "delete":
                self.pods.pop(arg, None)
            elif kind == "create":
                if arg["kind"] == "Pod" and arg["metadata"]["name"] not in self.pods:
                    self.pods[arg["metadata"]["name"]] = copy.deepcopy(arg)
                    self.created_total += 1
            else:
                pod = self.pods.get(arg.name)
                gates = pod["spec"].get("schedulingGates") if pod else None
                if (pod and pod["metadata"]["labels"]["rlkube.io/attempt"] == str(arg.attempt) and gates
                        and len(gates) > arg.position and gates[arg.position]["name"] == "rlkube.io/gang"):
                    del gates[arg.position]
        if crash_after is not None:
            return decision  # the Events (and a TTL deletion) never happened
        self.events.extend(decision.events)
        self.deleted_job = self.deleted_job or decision.delete_job
        return decision

    def bind_all(self, phase: str = "Running") -> None:
        """The scheduler binds every ungated pod to its planned node, the kubelet starts it."""
        for name, pod in list(self.pods.items()):
            if not pod["spec"].get("schedulingGates") and not pod["spec"].get("nodeName"):
                planned = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                    "nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
                self.pods[name] = with_status(pod, phase, node_name=planned, ready=phase == "Running")

    def set_pod(self, name: str, phase: str, **kw: Any) -> None:
        pod = self.pods[name]
        self.pods[name] = with_status(pod, phase, node_name=pod["spec"].get("nodeName"), **kw)

    @property
    def status(self) -> dict:
        return self.job.get("status") or {}

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


# Short backoffs, so a test walks a restart in a few steps.
FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15)


def world(nodes: list[dict] | None = None, settings: lifecycle.Settings = FAST, **kw: Any) -> World:
    """A job (`job(**kw)`) on nodes a and b (4 GPUs each) unless `nodes` are given."""
    return World(job(**kw), nodes if nodes is not None else [node("a", 4), node("b", 4)], settings)


def running_world(**kw: Any) -> World:
    """A PPO job (4 pods of 1 GPU) admitted, bound and running at t=3."""
    w = world(**kw)
    w.step(at(0))            # plan + create
    w.step(at(1))            # admit (ungate)
    w.bind_all()
    w.step(at(3))            # running
    assert w.status["phase"] == "Running", w.status
    return w
