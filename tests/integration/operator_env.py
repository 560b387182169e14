"""What the operator's integration tests run on: a real API server (the harness's control plane,
with its scheduler and controller-manager) plus what a control plane without kubelets lacks.

- Fake GPU nodes: real Node objects, created through the API, with `nvidia.com/gpu` allocatable
  and topology labels, kept Ready by renewing their node Leases (as a kubelet would), and
  labelled with a per-test pool so jobs of different tests never share nodes.
- `Kubelet`: a thread doing the two things a kubelet does that the tests rely on: a pod bound to
  one of our nodes is reported Running (with a pod IP), and a pod being deleted from one of our
  nodes is removed once "stopped" (deleted with grace period 0, as the kubelet does). Every other
  outcome (exit codes, evictions) the test writes itself into the pod's status.
- `Operator`: the operator as a subprocess (`python -m rlkube.operator`), namespace-scoped, with
  its log kept for the failure report.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkube.operator.controller.kubeapi import ApiError, KubeAPI

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "rlkube.io_rltrainingjobs.yaml"
POOL_LABEL = "rlkube.io/test-pool"

# The jobs these tests apply: a 2-layer qwen2 on synthetic data, run by the CPU runtime image
# (which no fake node ever pulls or starts).
TINY_MODEL = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259}}


def tiny_spec(actor_gpus: int = 1, algorithm: str = "dpo", **fields: Any) -> dict:
    """An RLTrainingJob spec: `algorithm` on the tiny model, the actor on `actor_gpus` GPUs with
    the reference colocated, synthetic data, the CPU runtime image; `fields` add or replace
    top-level spec fields (roles included)."""
    return copy.deepcopy({
        "algorithm": algorithm,
        "model": TINY_MODEL,
        "roles": {"actor": {"gpus": actor_gpus}, "reference": {"colocateWith": "actor"}},
        "data": {"source": "synthetic", "format": "synthetic"},
        "image": "localhost/rlkube/runtime-cpu:dev",
        **fields,
    })  # a test may change its copy


def now_micro() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_sec() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_until(what: str, condition: Callable[[], Any], timeout: float, interval: float = 0.2,
               diagnose: Callable[[], str] | None = None) -> Any:
    """Poll `condition` until it returns a truthy value; fail with `what` and a diagnosis."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except ApiError as exc:
            last_error = exc
        time.sleep(interval)
    detail = diagnose() if diagnose else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                         f"{f' (last error: {last_error})' if last_error else ''}\n{detail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Env:
    """One test module's namespace, node pool and API access."""

    def __init__(self, kubeconfig: str, kubectl: Callable[..., str], prefix: str = "it") -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl
        self.api = KubeAPI.from_environment(kubeconfig)
        self.namespace = f"rlkube-{prefix}-{uuid.uuid4().hex[:6]}"
        self.pool = self.namespace
        self.nodes: list[str] = []

    # -- set-up -------------------------------------------------------------------------------

    def install_crd(self) -> None:
        """Create or update the committed CRD (crds/) and wait until it is served."""
        import yaml

        crd = yaml.safe_load(CRD.read_text())
        name = crd["metadata"]["name"]
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        try:
            self.api.request("POST", path, body=crd)
        except ApiError as exc:
            if exc.status != 409:
                raise
            current = self.api.request("GET", f"{path}/{name}")
            crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self.api.request("PUT", f"{path}/{name}", body=crd)

        def established() -> bool:
            conditions = (self.api.request("GET", f"{path}/{name}").get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until("the CRD to be established", established, 60)

    def create_namespace(self) -> None:
        self.api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": self.namespace}})
        # Pods are refused until the namespace's default ServiceAccount exists.
        wait_until("the default ServiceAccount", lambda: self.api.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default"), 60)

    def add_node(self, name: str, gpus: int, labels: dict[str, str] | None = None) -> str:
        full = f"{self.pool}-{name}"
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": full, "labels": {"kubernetes.io/hostname": full, POOL_LABEL: self.pool,
                                                  **(labels or {})}},
            "spec": {},
        }
        self.api.request("POST", "/api/v1/nodes", body=node)
        self.nodes.append(full)
        self.node_heartbeat(full, gpus)
        # The apiserver taints a new node not-ready until the node lifecycle controller sees it
        # Ready; drop the taint at once so the tests do not wait for the controller's next pass.
        self.api.request("PATCH", f"/api/v1/nodes/{full}", body={"spec": {"taints": None}},
                         content_type="application/merge-patch+json")
        return full

    def node_heartbeat(self, name: str, gpus: int | None = None) -> None:
        """Ready condition and capacity in the node's status, and its Lease renewed (the two
        signals the node lifecycle controller reads)."""
        path = f"/api/v1/nodes/{name}/status"
        node = self.api.request("GET", f"/api/v1/nodes/{name}")
        alloc = (node.get("status") or {}).get("allocatable") or {}
        gpu = str(gpus) if gpus is not None else alloc.get("nvidia.com/gpu", "4")
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpu}
        status = {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake kubelet of the operator tests",
                            "lastHeartbeatTime": now_sec(), "lastTransitionTime": now_sec()}],
        }
        self.api.request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
        try:
            self.api.request("PATCH", lease_path, body={"spec": spec}, content_type="application/merge-patch+json")
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.api.request("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body={
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec})

    def set_node_gpus(self, name: str, gpus: int) -> None:
        self.node_heartbeat(name, gpus)

    def delete_node(self, name: str) -> None:
        try:
            self.api.request("DELETE", f"/api/v1/nodes/{name}")
        except ApiError as exc:
            if exc.status != 404:
                raise
        if name in self.nodes:
            self.nodes.remove(name)

    def teardown(self) -> None:
        for name in list(self.nodes):
            self.delete_node(name)
        try:
            self.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}")
        except ApiError:
            pass

    # -- jobs and pods ------------------------------------------------------------------------

    def job_body(self, name: str, spec: dict) -> dict:
        spec = json.loads(json.dumps(spec))
        spec.setdefault("nodeSelector", {})[POOL_LABEL] = self.pool
        return {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLTrainingJob",
                "metadata": {"name": name, "namespace": self.namespace}, "spec": spec}

    def create_job(self, name: str, spec: dict) -> dict:
        return self.api.request("POST", f"/apis/rlkube.io/v1alpha1/namespaces/{self.namespace}/rltrainingjobs",
                                body=self.job_body(name, spec))

    def job(self, name: str) -> dict | None:
        return self.api.get_job(self.namespace, name)

    def status(self, name: str) -> dict:
        return (self.job(name) or {}).get("status") or {}

    def patch_job_spec(self, name: str, patch: dict) -> None:
        self.api.request("PATCH", f"/apis/rlkube.io/v1alpha1/namespaces/{self.namespace}/rltrainingjobs/{name}",
                         body={"spec": patch}, content_type="application/merge-patch+json")

    def delete_job(self, name: str) -> None:
        self.api.request("DELETE", f"/apis/rlkube.io/v1alpha1/namespaces/{self.namespace}/rltrainingjobs/{name}")

    def pods(self, job: str | None = None) -> list[dict]:
        selector = f"rlkube.io/job={job}" if job else "rlkube.io/job"
        return self.api.list_pods(self.namespace, selector)

    def events(self, job: str) -> list[dict]:
        items = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events",
                                 query={"fieldSelector": f"involvedObject.name={job},involvedObject.kind=RLTrainingJob"})
        return sorted(items.get("items") or [], key=lambda e: e.get("lastTimestamp") or "")

    def event_reasons(self, job: str) -> list[str]:
        return [e["reason"] for e in self.events(job)]

    def set_pod_status(self, pod: dict, phase: str, *, exit_code: int | None = None, ready: bool = False,
                       ip: str | None = None, reason: str | None = None, disrupted: bool = False) -> None:
        """Write what a kubelet would report for `pod`."""
        meta = pod["metadata"]
        container = {"name": "trainer", "ready": ready, "restartCount": 0,
                     "image": pod["spec"]["containers"][0]["image"], "imageID": ""}
        if exit_code is not None:
            container["state"] = {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                                                 "startedAt": now_sec(), "finishedAt": now_sec()}}
        elif phase == "Running":
            container["state"] = {"running": {"startedAt": now_sec()}}
        else:
            container["state"] = {"waiting": {"reason": "ContainerCreating"}}
        conditions = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_sec()}]
        if disrupted:
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                               "lastTransitionTime": now_sec()})
        status: dict[str, Any] = {"phase": phase, "conditions": conditions, "containerStatuses": [container]}
        if ip:
            status["podIP"] = ip
            status["podIPs"] = [{"ip": ip}]
        if reason:
            status["reason"] = reason
        self.api.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                         body={"status": status}, content_type="application/merge-patch+json")

    def diagnose(self, *jobs: str) -> str:
        out = []
        for name in jobs:
            st = self.status(name)
            out.append(f"job {name}: phase={st.get('phase')} attempt={st.get('attempt')} restarts={st.get('restarts')}")
            for c in st.get("conditions") or []:
                out.append(f"  {c['type']}={c['status']} {c['reason']}: {c.get('message', '')[:200]}")
            for p in self.pods(name):
                m, s = p["metadata"], p.get("status") or {}
                out.append(f"  pod {m['name']} attempt={m['labels'].get('rlkube.io/attempt')} "
                           f"node={p['spec'].get('nodeName')} phase={s.get('phase')} "
                           f"gates={p['spec'].get('schedulingGates')} deleting={bool(m.get('deletionTimestamp'))}")
            out.append("  events: " + ", ".join(self.event_reasons(name)))
        return "\n".join(out)


class Kubelet:
    """The kubelet's part the tests need, for the nodes of one Env (see the module docstring)."""

    def __init__(self, env: Env, auto_run: bool = True, interval: float = 0.3, pods: bool = True) -> None:
        self.env = env
        self.auto_run = auto_run
        self.pods = pods  # False: only keep the nodes Ready
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)
        self._ips: dict[str, str] = {}
        self.errors: list[str] = []

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def ip_of(self, pod_name: str) -> str:
        # Loopback addresses: a test can serve a pod's /progress on its "pod IP".
        if pod_name not in self._ips:
            n = len(self._ips) + 2
            self._ips[pod_name] = f"127.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
        return self._ips[pod_name]

    def _loop(self) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() - last_beat > 8:
                    for name in list(self.env.nodes):
                        self.env.node_heartbeat(name)
                    last_beat = time.monotonic()
                if self.pods:
                    self.tick()
            except Exception as exc:  # keep going; the test reports what it sees
                self.errors.append(repr(exc))
            self._stop.wait(self.interval)

    def tick(self) -> None:
        ours = set(self.env.nodes)
        for pod in self.env.api.request("GET", f"/api/v1/namespaces/{self.env.namespace}/pods").get("items") or []:
            meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
            node = spec.get("nodeName")
            if not node or node not in ours:
                continue
            try:
                if meta.get("deletionTimestamp"):
                    # The containers "stopped": the kubelet removes the pod for good.
                    self.env.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                         body={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                                               "preconditions": {"uid": meta["uid"]}})
                elif self.auto_run and status.get("phase", "Pending") == "Pending":
                    self.env.set_pod_status(pod, "Running", ready=True, ip=self.ip_of(meta["name"]))
            except ApiError as exc:
                if exc.status not in (404, 409, 422):
                    raise


class Operator:
    """`python -m rlkube.operator` against the test cluster, scoped to one namespace."""

    def __init__(self, env: Env, log_dir: Path, identity: str | None = None, extra: list[str] | None = None,
                 fast: bool = True, kubeconfig: str | None = None, environ: dict[str, str] | None = None) -> None:
        self.env = env
        self.environ = environ or {}  # extra environment (the chart's POD_NAME, POD_UID, ...)
        self.kubeconfig = kubeconfig or env.kubeconfig
        self.fast = fast  # short resync and backoff for tests; False: the operator's defaults
        self.log_dir = log_dir
        self.identity = identity or f"it-{env.namespace}"
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.metrics_port = free_port()

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> Operator:
        self.starts += 1
        args = [
            sys.executable, "-m", "rlkube.operator",
            "--kubeconfig", self.kubeconfig, "-n", self.env.namespace,
            "--identity", self.identity, "--lease-namespace", self.env.namespace,
            "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1",
            *(["--resync-seconds", "2", "--backoff-base-seconds", "1", "--backoff-max-seconds", "4",
               "--unschedulable-retry-seconds", "2", "--log-level", "DEBUG",
               # kwok nodes write no checkpoints: gangs may span nodes without a volumeClaim here
               # (the one-node rule is tests/unit/operator/test_checkpoint_store.py's).
               "--host-path-shared"] if self.fast else []),
            *self.extra,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **self.environ}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w")  # noqa: SIM115 (handed to the child)
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        log.close()
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        wait_until("the operator to be ready", lambda: self.alive() and "operator ready" in self.log_path.read_text(),
                   timeout, diagnose=self.tail)

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited ({self.proc and self.proc.returncode}):\n{self.tail()}")
        return True

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob("operator-*.log")))


def restricted_kubeconfig(env: Env, directory: Path) -> str:
    """A kubeconfig for a ServiceAccount holding exactly the RBAC rules of `rlkube.operator.controller.rbac`
    (Role in the test namespace for the watched and operator scopes, ClusterRole for the cluster
    scope), so the operator under test proves those rules are enough. Returns its path."""
    from rlkube.operator.controller import rbac

    ns, sa = env.namespace, "rlkube-operator"
    api = env.api
    api.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    rbac_path = "/apis/rbac.authorization.k8s.io/v1"
    rules = rbac.rules_for("watched") + rbac.rules_for("operator")
    api.request("POST", f"{rbac_path}/namespaces/{ns}/roles",
                body={"metadata": {"name": sa}, "rules": rules})
    api.request("POST", f"{rbac_path}/namespaces/{ns}/rolebindings", body={
        "metadata": {"name": sa}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa}})
    cluster_name = f"{ns}-operator"
    api.request("POST", f"{rbac_path}/clusterroles",
                body={"metadata": {"name": cluster_name}, "rules": rbac.cluster_role_rules(clusterwide=False)})
    api.request("POST", f"{rbac_path}/clusterrolebindings", body={
        "metadata": {"name": cluster_name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name}})
    env.cluster_rbac = cluster_name
    token = api.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                              "spec": {"expirationSeconds": 3600}})["status"]["token"]
    import yaml

    cluster = yaml.safe_load(Path(env.kubeconfig).read_text())["clusters"][0]  # JSON is YAML too
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa, "namespace": ns}}],
        "current-context": sa,
    }
    path = directory / "operator.kubeconfig"
    path.write_text(json.dumps(config))
    return str(path)


def drop_cluster_rbac(env: Env) -> None:
    name = getattr(env, "cluster_rbac", None)
    if not name:
        return
    for kind in ("clusterrolebindings", "clusterroles"):
        try:
            env.api.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{name}")
        except ApiError:
            pass
