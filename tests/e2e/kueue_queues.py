"""What the Kueue e2e tests set up and watch: a team's queues, and a sampler of GPUs in use.

The queue objects are Kueue's own kinds, created through the real API server and checked by
Kueue's real webhooks (the `kueue` fixture, tests/cluster/kueue.py). The sampler reads the
cluster every half second in a thread, so the tests can assert on the whole run (the most GPUs
ever admitted or held by pods, the order of admissions, every phase a job went through) rather
than on a few snapshots.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from rlkube.operator.render import kueue_workload as kw
from tests.cluster.api import ApiError, Client
from tests.e2e import deploy

KUEUE_API = f"/apis/{kw.GROUP}/{kw.VERSION}"
GPU = "nvidia.com/gpu"


class TeamQueues:
    """A ResourceFlavor, a ClusterQueue of `gpus` GPUs (StrictFIFO, preemption of lower
    priorities within it), a LocalQueue in `namespace` and two PriorityClasses. Cluster-scoped
    names carry a random suffix, so a crashed earlier run never collides with this one."""

    def __init__(self, api: Client, namespace: str, gpus: int = 2) -> None:
        self.api, self.namespace, self.gpus = api, namespace, gpus
        suffix = uuid.uuid4().hex[:5]
        self.flavor = self.cluster_queue = f"rlk-e2e-{suffix}"
        self.local_queue = "team-a"
        self.priorities = {"low": (f"rlk-e2e-{suffix}-low", 10), "high": (f"rlk-e2e-{suffix}-high", 1000)}

    def create(self) -> None:
        api = self.api.request
        api("POST", f"{KUEUE_API}/resourceflavors", {
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "ResourceFlavor", "metadata": {"name": self.flavor}})
        # Kueue needs every resource a pod requests covered; cpu and memory are generous, so GPUs
        # are the only quota that binds.
        quota = [{"name": "cpu", "nominalQuota": "16"}, {"name": "memory", "nominalQuota": "64Gi"},
                 {"name": GPU, "nominalQuota": str(self.gpus)}]
        api("POST", f"{KUEUE_API}/clusterqueues", {
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "ClusterQueue", "metadata": {"name": self.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                "queueingStrategy": "StrictFIFO",
                "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU],
                                    "flavors": [{"name": self.flavor, "resources": quota}]}],
                "preemption": {"withinClusterQueue": "LowerPriority"},
            },
        })  # fmt: skip
        api("POST", f"{KUEUE_API}/namespaces/{self.namespace}/localqueues", {
            "apiVersion": f"{kw.GROUP}/{kw.VERSION}", "kind": "LocalQueue",
            "metadata": {"name": self.local_queue, "namespace": self.namespace},
            "spec": {"clusterQueue": self.cluster_queue}})
        for name, value in self.priorities.values():
            api("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value})
        deploy.wait_until("the ClusterQueue Active", lambda: any(
            c["type"] == "Active" and c["status"] == "True"
            for c in (self.cluster_queue_status().get("conditions") or [])), 60)

    def cluster_queue_status(self) -> dict:
        return self.api.get(f"{KUEUE_API}/clusterqueues/{self.cluster_queue}").get("status") or {}

    def gpus_reserved(self) -> int:
        """nvidia.com/gpu quota the ClusterQueue has reserved for admitted Workloads right now."""
        return sum(_quantity(r.get("total", "0"))
                   for f in self.cluster_queue_status().get("flavorsReservation") or []
                   for r in f.get("resources") or [] if r.get("name") == GPU)  # fmt: skip

    def workloads(self) -> list[dict]:
        return self.api.get(f"{KUEUE_API}/namespaces/{self.namespace}/workloads")["items"]

    def delete(self) -> None:
        paths = [f"{KUEUE_API}/namespaces/{self.namespace}/localqueues/{self.local_queue}",
                 f"{KUEUE_API}/clusterqueues/{self.cluster_queue}", f"{KUEUE_API}/resourceflavors/{self.flavor}"]
        paths += [f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}" for name, _ in self.priorities.values()]
        for path in paths:
            try:
                self.api.delete(path)
                # Kueue's finalizers hold a queue or flavor while something uses it: wait, so none is
                # left Terminating once Kueue stops.
                deploy.wait_until(f"{path} deleted", lambda p=path: self._gone(p), 60)
            except ApiError as err:
                if err.status != 404:
                    raise

    def _gone(self, path: str) -> bool:
        try:
            self.api.get(path)
        except ApiError as err:
            return err.status == 404
        return False


def _quantity(text: str) -> int:
    """GPU quantities are whole numbers ("2"); anything else is a defect of the test's setup."""
    return int(str(text))


@dataclass
class Sample:
    at: float
    gpus_reserved: int          # the ClusterQueue's reservation of nvidia.com/gpu
    gpus_in_pods: int           # GPU requests of the queue namespace's pods not yet gone
    admitted: set[str]          # jobs whose Workload is admitted and not finished
    phases: dict[str, tuple[str, str]]  # job -> (phase, Progressing reason)


@dataclass
class GpuSampler:
    """Samples the queue namespace every `interval` seconds until stopped (use as a context)."""

    api: Client
    queues: TeamQueues
    jobs_namespaces: tuple[str, ...]
    interval: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        # The state the test last waited for may have come after the thread's last sample.
        self.samples.append(self.sample())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as err:  # the API server busy for a moment: recorded, not fatal
                self.errors.append(f"{time.monotonic() - self.t0:.1f}s: {err}")
            self._stop.wait(self.interval)

    def sample(self) -> Sample:
        ns = self.queues.namespace
        pods = self.api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        # A pod holds its GPUs until it is gone: terminating ones (deletionTimestamp) count.
        in_pods = sum(_quantity(c.get("resources", {}).get("requests", {}).get(GPU, "0"))
                      for p in pods if p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
                      for c in p["spec"]["containers"])  # fmt: skip
        admitted = set()
        for wl in self.queues.workloads():
            state = kw.observe_workload(wl)
            if state.quota_reserved and not state.finished:
                admitted.add(wl["metadata"]["labels"][kw.LABEL_JOB])
        phases = {}
        for job_ns in self.jobs_namespaces:
            for job in self.api.get(f"/apis/rlkube.io/v1alpha1/namespaces/{job_ns}/rltrainingjobs")["items"]:
                status = job.get("status") or {}
                cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {})
                phases[job["metadata"]["name"]] = (status.get("phase") or "", cond.get("reason") or "")
        return Sample(time.monotonic() - self.t0, self.queues.gpus_reserved(), in_pods, admitted, phases)

    # -- what the samples say -----------------------------------------------------------------

    def first(self, job: str, what) -> float | None:
        """Seconds into the run of the first sample where `what(sample)` held for `job`."""
        return next((s.at for s in self.samples if what(job, s)), None)

    def phases_of(self, job: str) -> list[str]:
        """The job's phases in the order seen, repeats collapsed."""
        out: list[str] = []
        for s in self.samples:
            phase = s.phases.get(job, ("", ""))[0]
            if phase and (not out or out[-1] != phase):
                out.append(phase)
        return out

    def summary(self) -> str:
        return (f"{len(self.samples)} samples over {self.samples[-1].at if self.samples else 0:.0f} s, "
                f"max reserved {max((s.gpus_reserved for s in self.samples), default=0)}, "
                f"max in pods {max((s.gpus_in_pods for s in self.samples), default=0)}, "
                f"{len(self.errors)} sampling errors")


def admitted(job: str, s: Sample) -> bool:
    return job in s.admitted


def succeeded(job: str, s: Sample) -> bool:
    return s.phases.get(job, ("", ""))[0] == "Succeeded"


def running(job: str, s: Sample) -> bool:
    return s.phases.get(job, ("", ""))[0] == "Running"
