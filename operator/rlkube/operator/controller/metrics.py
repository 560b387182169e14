"""The operator's own Prometheus metrics and its health/metrics HTTP endpoint.

Besides its own work (reconciles, errors, leadership) the operator exports what it knows of each
job from the status it writes: the job's phase, its gang restarts and how long it waited for its
first admission (docs/metrics.md has every name; the chart's dashboard and alerts use them).

Served on one port (default 8080): `/metrics` (Prometheus text), `/healthz` (liveness: 200 while
the operator's event loop keeps beating, so a frozen loop gets the pod restarted) and `/readyz`
(200 once this replica leads and its watches run; standby replicas answer 503).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from rlkube.operator.api.observed import parse_time
from rlkube.operator.api.status_types import PHASES

# Admission waits run from seconds (a free cluster) to hours (a full Kueue queue).
ADMISSION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200)


class Metrics:
    """Reconcile counts by action, reconcile latency, errors by kind, leadership, heartbeat."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "rlkube_operator_reconciles_total", "Reconciles of RLTrainingJobs, by the action decided.",
            ["action"], registry=self.registry,
        )
        self.latency = Histogram(
            "rlkube_operator_reconcile_seconds", "Wall time of one reconcile (API reads, decision, writes).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry,
        )
        self.errors = Counter(
            "rlkube_operator_reconcile_errors_total", "Reconciles that failed, by error kind.",
            ["kind"], registry=self.registry,
        )
        self.leader = Gauge(
            "rlkube_operator_leader", "1 while this replica holds the leader lease.", registry=self.registry,
        )
        self.queue_depth = Gauge(
            "rlkube_operator_queue_jobs", "Jobs waiting for or in a reconcile.", registry=self.registry,
        )
        self._beat = time.monotonic()
        self.ready = False
        self._jobs_metrics()

    def _jobs_metrics(self) -> None:
        self.jobs = Gauge("rlkube_operator_jobs", "Jobs this operator has reconciled, by status.phase.",
                          ["phase"], registry=self.registry)
        self.job_phase = Gauge(
            "rlkube_operator_job_phase", "1 for the job's status.phase, 0 for the other phases.",
            ["namespace", "rltj", "phase"], registry=self.registry,
        )
        self.restarts = Counter(
            "rlkube_operator_job_restarts", "Gang restarts of the job (status.restarts).",
            ["namespace", "rltj"], registry=self.registry,
        )
        self.admission_wait = Histogram(
            "rlkube_operator_admission_wait_seconds", "From the job's creation to its first gang's admission "
            "(status.admissionTime of attempt 0): Kueue's queue, waiting for GPUs, placement.",
            buckets=ADMISSION_BUCKETS, registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        self._restarts: dict[tuple[str, str], int] = {}
        self._jobs_lock = threading.Lock()
        for phase in PHASES:  # every phase has a series from the start, so sum() never sees a gap
            self.jobs.labels(phase).set(0)

    def observe_reconcile(self, action: str, seconds: float) -> None:
        self.reconciles.labels(action=action).inc()
        self.latency.observe(seconds)

    def observe_error(self, kind: str) -> None:
        self.errors.labels(kind=kind).inc()

    def observe_job(self, namespace: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any],
                    created: str) -> None:
        """A reconcile turned status `old` into `new`: the job's phase and restarts, and its
        admission wait when this reconcile admitted its first gang (`created`: creationTimestamp).

        Restarts are counted from status.restarts, so a restarted operator's counter starts where
        the status is, and Prometheus sees no reset and no jump."""
        key, phase = (namespace, name), str(new.get("phase") or "Pending")
        with self._jobs_lock:
            self._phases[key] = phase
            for p in PHASES:
                self.job_phase.labels(namespace, name, p).set(1 if p == phase else 0)
            self._count_phases()
            restarts = int(new.get("restarts") or 0)
            seen = self._restarts.get(key, 0)
            self.restarts.labels(namespace, name).inc(max(0, restarts - seen))
            self._restarts[key] = max(restarts, seen)
        wait = admission_wait(old, new, created)
        if wait is not None:
            self.admission_wait.observe(wait)

    def forget_job(self, namespace: str, name: str) -> None:
        """The job is gone (or being deleted): drop its series."""
        key = (namespace, name)
        with self._jobs_lock:
            if self._phases.pop(key, None) is None:
                return
            self._restarts.pop(key, None)
            for p in PHASES:
                self.job_phase.remove(namespace, name, p)
            try:
                self.restarts.remove(namespace, name)
            except KeyError:
                pass
            self._count_phases()

    def _count_phases(self) -> None:
        counts = dict.fromkeys(PHASES, 0)
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        for phase, count in counts.items():
            self.jobs.labels(phase).set(count)

    def beat(self) -> None:
        self._beat = time.monotonic()

    def beat_age(self) -> float:
        return time.monotonic() - self._beat


def admission_wait(old: Mapping[str, Any], new: Mapping[str, Any], created: str) -> float | None:
    """Seconds from `created` to the admission of attempt 0, when `new` is the status that first
    records it (None otherwise: a later attempt's admission is a restart, not a wait in line)."""
    admitted = new.get("admissionTime")
    if not admitted or admitted == old.get("admissionTime") or int(new.get("attempt") or 0) != 0:
        return None
    start, end = parse_time(created), parse_time(admitted)
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def serve(metrics: Metrics, port: int, host: str = "0.0.0.0", max_beat_age: float = 60.0,
          healthy: Callable[[], bool] | None = None) -> ThreadingHTTPServer:
    """Start the /metrics, /healthz, /readyz server on a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok = metrics.beat_age() < max_beat_age and (healthy is None or healthy())
                self._send(200 if ok else 503, b"ok\n" if ok else b"event loop stalled\n")
            elif path == "/readyz":
                self._send(200 if metrics.ready else 503, b"ready\n" if metrics.ready else b"standby\n")
            else:
                self._send(404, b"not found\n")

        def _send(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # probes every few seconds: keep logs quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rlkube-metrics", daemon=True).start()
    return server
