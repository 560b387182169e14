"""rlkube deployed on the test cluster the way a user deploys it: images, Helm, kubectl.

Shared by the e2e tests (tests/e2e/conftest.py) and `make demo` (tests/e2e/demo.py). Everything
goes through the real tools: the images are built by buildah from images/*/Dockerfile and
imported into every node's containerd (tests/cluster/images.py), the operator is installed by
the harness's helm from charts/rlkube, jobs are applied and read with kubectl. Nothing here
talks to Kubernetes any other way, so what passes here is what a user sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import bins, images
from tests.sections import with_sections

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlkube"
EXAMPLES = REPO / "examples"

OPERATOR_NAMESPACE = "rlkube-system"
RELEASE = "rlkube"
OPERATOR_IMAGE = "operator"
RUNTIME_IMAGE = "runtime-cpu"
# Pod Security Standards labels of the operator's namespace: the chart must run under "restricted".
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
TERMINAL = ("Succeeded", "Failed")
# The operator's --node-lost-grace-seconds in the e2e install (the chart's default is 60).
NODE_LOST_GRACE = 5


class JobTimeout(AssertionError):
    """A job did not reach the awaited state in time (the message says where it was)."""


# -- images ----------------------------------------------------------------------------------------

# Input hash of each image loaded into the nodes by this process. Every build is tagged `:dev`,
# so the operator's pod template carries the hash: a rebuilt operator image rolls the Deployment
# on the next `helm upgrade`, instead of leaving the old container running under the same tag.
LOADED: dict[str, str] = {}


def build_and_load(cluster, name: str) -> str:
    """Build images/<name> (cached by input hash) and import it into every node; returns its ref.

    tests/cluster/images.py runs images/build_context.py first (the wheels, pinned to the tested
    venv's versions), then buildah; the archive is reused while the inputs stay the same.
    """
    t0 = time.monotonic()
    archive = images.build(name)
    images.load(cluster.layout, cluster.nodes, archive)
    LOADED[name] = archive.input_hash
    log(f"image {archive.ref} ready on {len(cluster.nodes)} nodes ({time.monotonic() - t0:.0f} s)")
    return archive.ref


# -- helm ------------------------------------------------------------------------------------------


def helm(cluster, *args: str, input: str | None = None, check: bool = True,
         timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the harness's helm against the cluster (`input` is its stdin, e.g. for `--values -`)."""
    proc = subprocess.run([str(bins.helm()), f"--kubeconfig={cluster.kubeconfig}", *args],
                          input=input, capture_output=True, text=True, timeout=timeout)  # fmt: skip
    if check and proc.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def local_values(**extra: Any) -> dict:
    """Chart values for the harness: the locally built operator image, never pulled."""
    values: dict[str, Any] = {"image": {"repository": images.ref_for(OPERATOR_IMAGE).rsplit(":", 1)[0],
                                        "tag": "dev", "pullPolicy": "Never"},
                              # The harness's nodes share this machine's disk: /var/lib/rlkube is
                              # one filesystem for both, so gangs may span them with hostPath.
                              "checkpoints": {"hostPathShared": True},
                              # A short grace keeps the node-loss tests short (test_node_loss.py).
                              "nodeLost": {"graceSeconds": NODE_LOST_GRACE, "countsAgainstBackoffLimit": False}}  # fmt: skip
    if OPERATOR_IMAGE in LOADED:
        values["podAnnotations"] = {"rlkube.io/image-input-hash": LOADED[OPERATOR_IMAGE]}
    values.update(extra)
    return values


def ensure_namespace(cluster, name: str, labels: dict[str, str] | None = None) -> None:
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


def install(cluster, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE, values: dict | None = None,
            upgrade: bool = True) -> None:
    """`helm upgrade --install` the chart into a PSS-restricted namespace and wait for the operator."""
    ensure_namespace(cluster, namespace, RESTRICTED)
    verb = ["upgrade", "--install"] if upgrade else ["install"]
    values = values if values is not None else local_values()
    helm(cluster, *verb, release, str(CHART), "--namespace", namespace, "--values", "-", "--wait",
         "--timeout", "240s", input=yaml.safe_dump(values))
    wait_operator_ready(cluster, release, namespace)


def operator_pods(cluster, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l",
                          f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator", "-o", "json")
    return json.loads(out)["items"]


def wait_operator_ready(cluster, release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE,
                        timeout: float = 180) -> dict:
    """The operator's pod once it is Ready (its readiness probe is kopf's liveness endpoint)."""
    def ready() -> dict | None:
        for pod in operator_pods(cluster, release, namespace):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                return pod
        return None

    return wait_until(f"operator pod of release {release} Ready", ready, timeout)


# -- jobs ------------------------------------------------------------------------------------------


def job_manifest(name: str, namespace: str, example: str = "dpo-tiny-cpu.yaml", **spec: Any) -> dict:
    """An example manifest with its name, namespace and some spec sections replaced.

    `spec` keys are the spec's top-level sections (camelCase); a dict value is merged into the
    example's section, anything else replaces it.
    """
    job = yaml.safe_load((EXAMPLES / example).read_text())
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"] = with_sections(job["spec"], spec)
    return job


def apply(cluster, obj: dict) -> str:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def get_job(cluster, namespace: str, name: str) -> dict:
    return json.loads(cluster.kubectl("get", "rltj", name, "-n", namespace, "-o", "json"))


def job_pods(cluster, namespace: str, name: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"rlkube.io/job={name}", "-o", "json")
    return json.loads(out)["items"]


def phase(job: dict) -> str:
    return (job.get("status") or {}).get("phase") or ""


def step(job: dict) -> int:
    return int(((job.get("status") or {}).get("progress") or {}).get("step") or 0)


def wait_job(cluster, namespace: str, name: str, until: Callable[[dict], bool], what: str,
             timeout: float = 300, stop_on_terminal: bool = True) -> dict:
    """Poll the job until `until(job)` holds; fails early when it ends in a phase `until` rejects."""
    def check() -> dict | None:
        job = get_job(cluster, namespace, name)
        if until(job):
            return job
        if stop_on_terminal and phase(job) in TERMINAL:
            status = job.get("status") or {}
            raise AssertionError(f"job {namespace}/{name} ended {phase(job)} before {what}: "
                                 f"conditions={status.get('conditions')}")
        return None

    return wait_until(f"job {namespace}/{name}: {what}", check, timeout,
                      describe=lambda: _job_summary(cluster, namespace, name))


def wait_phase(cluster, namespace: str, name: str, wanted: str, timeout: float = 300) -> dict:
    return wait_job(cluster, namespace, name, lambda j: phase(j) == wanted, f"phase {wanted}", timeout,
                    stop_on_terminal=wanted not in TERMINAL)


def events(cluster, namespace: str, name: str) -> list[dict]:
    """Events whose object is the job, oldest first.

    Event timestamps have one-second resolution, and the operator often posts two in the same
    second (Placed, then Admitted), so ties are broken by resourceVersion: the API server (etcd)
    hands those out in increasing order of writes.
    """
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.kind=RLTrainingJob,involvedObject.name={name}", "-o", "json")
    items = json.loads(out)["items"]
    return sorted(items, key=_event_order)


def _event_order(event: dict) -> tuple[str, int]:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or ""
    version = event["metadata"].get("resourceVersion", "")
    return stamp, int(version) if version.isdigit() else 0


HOST_CHECKPOINTS = Path("/var/lib/rlkube")  # render.HOST_CHECKPOINT_ROOT, as this machine sees it


def delete_job(cluster, namespace: str, name: str) -> None:
    """Delete the job and check that nothing of it is left: its hostPath checkpoint folder is
    removed by the operator's cleanup pod, and that pod is gone too (operator/.../cleanup.py).

    The harness's nodes share this machine's disk, and a kind cluster's workers bind-mount this
    machine's /var/lib/rlkube (kind.SHARED_PATHS), so the folder is checked here directly."""
    found = cluster.kubectl("get", "rltj", name, "-n", namespace, "-o", "json", "--ignore-not-found")
    cluster.kubectl("delete", "rltj", name, "-n", namespace, "--ignore-not-found", "--wait=true", timeout=180)
    if not found.strip():
        return
    job = json.loads(found)
    if (job["spec"].get("checkpoint") or {}).get("volumeClaim"):
        return
    folder = HOST_CHECKPOINTS / namespace / f"{name}-{job['metadata']['uid']}"
    wait_until(f"the hostPath checkpoint folder {folder} of deleted job {name} to be removed",
               lambda: not folder.exists(), 120, interval=2.0)
    selector = f"rlkube.io/checkpoint-cleanup={name[:63].rstrip('-_.')}"
    wait_until(f"the checkpoint cleanup pods of {name} to be deleted",
               lambda: not json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector,
                                                      "-o", "json"))["items"], 60, interval=2.0)


def _job_summary(cluster, namespace: str, name: str) -> str:
    try:
        job = get_job(cluster, namespace, name)
    except RuntimeError as err:
        return str(err)
    status = job.get("status") or {}
    pods = [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in job_pods(cluster, namespace, name)]
    return f"phase={status.get('phase')} step={step(job)} conditions={status.get('conditions')} pods={pods}"


# -- waiting and diagnostics -------------------------------------------------------------------------


def wait_until(what: str, probe: Callable[[], Any], timeout: float, interval: float = 1.0,
               describe: Callable[[], str] | None = None) -> Any:
    """Call `probe` until it returns something truthy (returned); JobTimeout after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            state = f"; last state: {describe()}" if describe else ""
            raise JobTimeout(f"timed out after {timeout:.0f} s waiting for {what}{state}")
        time.sleep(interval)


def dump(cluster, namespaces: list[str], release: str = RELEASE,
         operator_namespace: str = OPERATOR_NAMESPACE) -> str:
    """Operator logs, events, jobs and pods of `namespaces` as text, for a failing test's report."""
    def run(*args: str) -> str:
        try:
            return cluster.kubectl(*args, check=False, timeout=30)
        except Exception as err:  # a dump must never hide the original failure
            return f"<kubectl {' '.join(args)}: {err}>"

    selector = f"app.kubernetes.io/instance={release}"
    parts = [
        ("operator pods", run("get", "pods", "-n", operator_namespace, "-l", selector, "-o", "wide")),
        ("operator logs", run("logs", "-n", operator_namespace, "-l", selector, "--tail=300", "--all-containers")),
        ("operator logs (previous container)",
         run("logs", "-n", operator_namespace, "-l", selector, "--tail=100", "--previous")),
    ]
    for ns in namespaces:
        parts += [
            (f"{ns}: rltj", run("get", "rltj", "-n", ns, "-o", "wide")),
            (f"{ns}: events", run("get", "events", "-n", ns, "--sort-by=.lastTimestamp")),
            (f"{ns}: rltj yaml", run("get", "rltj", "-n", ns, "-o", "yaml")),
            (f"{ns}: pods", run("get", "pods", "-n", ns, "-o", "wide", "--show-labels")),
            (f"{ns}: training pod logs", run("logs", "-n", ns, "-l", "rlkube.io/job", "--tail=40",
                                               "--all-containers", "--prefix")),
        ]
    return "\n".join(f"===== {title} =====\n{text.rstrip()}" for title, text in parts)


def log(message: str) -> None:
    print(f"[rlkube {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- long runs, to act on mid-training ----------------------------------------------------------

# The operator reads a trainer's progress on its resync timer (10 s), so a run must last well
# beyond that for a test to act mid-run. The demo's sizes train a step in ~0.15 s on an idle
# 2-core machine (30 steps in ~5 s, measured here); these sizes are ~4x the work per step and
# 8x the steps: about 1.5 min idle, a few minutes on a loaded machine.
LONG_STEPS = 240
EVERY = 20
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


def long_job(deployed, prefix: str, **spec: Any) -> tuple[str, dict]:
    """A DPO job long enough to act on mid-run, checkpointing every EVERY steps; `spec` as in
    job_manifest."""
    name = deployed.job_name(prefix)
    job = job_manifest(
        name, deployed.jobs_namespace,
        training={"steps": LONG_STEPS},
        checkpoint={"everySteps": EVERY, "keep": 2},
        data={"numSamples": 1024, "maxSeqLen": 128},
        batching={"globalBatch": 16, "maxTokensPerGpu": 4096},
        **spec,
    )  # fmt: skip
    return name, job


def rank0_pod(cluster, ns: str, name: str) -> dict:
    (pod,) = [p for p in job_pods(cluster, ns, name) if p["metadata"]["labels"].get("rlkube.io/pod-index") == "0"]
    return pod


class FollowedLogs:
    """`kubectl logs -f` of the given pods, from now until `stop()`: what an attempt printed while it
    shut down, kept after its pods are gone (a test's failure message quotes it)."""

    def __init__(self, cluster, ns: str, pods: list[str]):
        self.files = {pod: tempfile.TemporaryFile(mode="w+") for pod in pods}
        self.procs = [subprocess.Popen([str(bins.kubectl()), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
                                        "-n", ns, pod, "--all-containers", "--prefix", "--since=30s"],
                                       stdout=out, stderr=subprocess.STDOUT)
                      for pod, out in self.files.items()]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)

    def tail(self, lines: int = 25) -> str:
        """The last `lines` of each pod's log, under its name."""
        out = []
        for pod, f in self.files.items():
            f.seek(0)
            out.append(f"--- {pod} (last {lines} lines)\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)


def resumed_step(cluster, ns: str, name: str) -> int | None:
    """The step the current attempt's rank 0 resumed at, from its log (None: it started fresh)."""
    pod = rank0_pod(cluster, ns, name)["metadata"]["name"]
    found = RESUMED.findall(cluster.kubectl("logs", "-n", ns, pod, "--all-containers"))
    return int(found[-1][1]) if found else None
