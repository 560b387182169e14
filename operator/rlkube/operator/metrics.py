"""The operator's own Prometheus metrics and its health/metrics HTTP endpoint.

Served on one port (default 8080): `/metrics` (Prometheus text), `/healthz` (liveness: 200 while
the operator's event loop keeps beating, so a frozen loop gets the pod restarted) and `/readyz`
(200 once this replica leads and its watches run; standby replicas answer 503).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)


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

    def observe_reconcile(self, action: str, seconds: float) -> None:
        self.reconciles.labels(action=action).inc()
        self.latency.observe(seconds)

    def observe_error(self, kind: str) -> None:
        self.errors.labels(kind=kind).inc()

    def beat(self) -> None:
        self._beat = time.monotonic()

    def beat_age(self) -> float:
        return time.monotonic() - self._beat


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
