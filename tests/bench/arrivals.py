"""Jobs that arrive at a steady rate, and what a pod watch sees of them (for bench_operator.py).

`PodWatch` follows the namespace's pods with one watch stream (no polling lists of thousands of
pods): for each job (label `rlkube.io/job`, or `job-name` for batch Jobs) the time its last pod
was created and the time its last scheduling gate was removed. `submit_steady` creates the jobs
one by one at `rate` per second from a few client threads and records when each create returned.
`ProcessUsage` reads the operator's CPU seconds and peak memory from /proc.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

JOB_LABELS = ("rlkube.io/job", "job-name")


class PodWatch:
    def __init__(self, client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.created: dict[str, float] = {}  # pod -> first seen
        self.ungated: dict[str, float] = {}  # pod -> first seen without scheduling gates
        self.job_of: dict[str, str] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-watch", daemon=True)
        self.errors: list[str] = []

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _loop(self) -> None:
        version = self.client.get(f"/api/v1/namespaces/{self.namespace}/pods?limit=1")["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            url = (f"{self.client.server}/api/v1/namespaces/{self.namespace}/pods?watch=1"
                   f"&allowWatchBookmarks=true&timeoutSeconds=30&resourceVersion={version}")
            try:
                with urllib.request.urlopen(url, context=self.client._ctx, timeout=60) as stream:
                    for line in stream:
                        if self._stop.is_set():
                            return
                        event = json.loads(line)
                        obj = event["object"]
                        version = obj["metadata"].get("resourceVersion", version)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._seen(obj, time.monotonic())
            except Exception as exc:  # a dropped stream resumes from the last version seen
                self.errors.append(repr(exc))
                time.sleep(0.2)

    def _seen(self, pod: dict, now: float) -> None:
        name = pod["metadata"]["name"]
        labels = pod["metadata"].get("labels") or {}
        job = next((labels[key] for key in JOB_LABELS if key in labels), None)
        if job is None:
            return
        with self.lock:
            self.job_of.setdefault(name, job)
            self.created.setdefault(name, now)
            if not pod["spec"].get("schedulingGates"):
                self.ungated.setdefault(name, now)

    def per_job(self, times: dict[str, float], pods_per_job: int) -> dict[str, float]:
        """job -> time its last pod reached the state, for jobs with all pods there."""
        with self.lock:
            by_job: dict[str, list[float]] = defaultdict(list)
            for pod, when in times.items():
                by_job[self.job_of[pod]].append(when)
        return {job: max(ts) for job, ts in by_job.items() if len(ts) >= pods_per_job}


def submit_steady(client, bodies: list[tuple[str, dict]], rate: float, workers: int = 8) -> dict[str, float]:
    """POST body i at t0 + i / rate (a steady arrival); returns job name -> time the create returned."""
    t0 = time.monotonic()
    done: dict[str, float] = {}

    def one(i: int) -> None:
        path, body = bodies[i]
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        client.post(path, body)
        done[body["metadata"]["name"]] = time.monotonic()

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(len(bodies))))
    return done


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


class ProcessUsage:
    """CPU seconds (user + system) and peak resident memory of one process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.start_cpu = self.cpu_seconds()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks

    def memory_mib(self) -> dict[str, float]:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines())
        return {key: round(int(status[key].split()[0]) / 1024, 1) for key in ("VmRSS", "VmHWM")}


def request_counts(client) -> dict[str, float]:
    """The API server's own count of the requests it served (apiserver_request_total), summed
    per 'VERB resource[/subresource]' and the seconds it spent on them
    (apiserver_request_duration_seconds_sum), from its /metrics; watches are left out."""
    raw = client.request("GET", "/metrics")
    text = raw if isinstance(raw, str) else ""
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        for metric, suffix in (("apiserver_request_total{", ""), ("apiserver_request_duration_seconds_sum{", " s")):
            if not line.startswith(metric):
                continue
            labels = dict(part.split("=", 1) for part in line[len(metric):line.rindex("}")].split(",") if "=" in part)
            labels = {k: v.strip('"') for k, v in labels.items()}
            if labels.get("verb") in ("WATCH", "CONNECT") or not labels.get("resource"):
                continue
            name = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            out[f"{labels['verb']} {name}{suffix}"] += float(line.rsplit(" ", 1)[1])
    return out


def request_delta(before: dict[str, float], after: dict[str, float], top: int = 40) -> dict[str, float]:
    """after - before, the `top` largest by count, then their seconds."""
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    counts = sorted((k for k in delta if not k.endswith(" s") and delta[k] > 0), key=lambda k: -delta[k])[:top]
    return {**{k: int(delta[k]) for k in counts}, **{f"{k} s": round(delta.get(f"{k} s", 0.0), 1) for k in counts}}
