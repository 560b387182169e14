"""Rank 0's HTTP endpoint: /progress (JSON), /metrics (Prometheus), /healthz.

The operator polls /progress on a timer and writes status.progress; Prometheus scrapes
/metrics. Other ranks serve /healthz only, on the same port. The server is the standard
library's ThreadingHTTPServer on a daemon thread: the training loop only updates a
`Progress` object under a lock, it never waits for a client.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

FIELDS = ("phase", "step", "totalSteps", "tokensPerSecond", "mfu", "gpuUtilization", "loss", "rewardMean")


class Progress:
    """The job's current state, shared between the training loop and the HTTP thread."""

    def __init__(self, total_steps: int) -> None:
        self._lock = threading.Lock()
        self._state: dict = {k: None for k in FIELDS}
        self._state.update(phase="starting", step=0, totalSteps=total_steps)
        self.registry = CollectorRegistry()
        self._gauges = {
            "step": Gauge("rlkube_step", "Optimizer steps completed", registry=self.registry),
            "totalSteps": Gauge("rlkube_total_steps", "Optimizer steps to run", registry=self.registry),
            "tokensPerSecond": Gauge("rlkube_tokens_per_second", "Non-pad tokens per second", registry=self.registry),
            "mfu": Gauge("rlkube_mfu", "Model FLOPs utilization against the card's peak", registry=self.registry),
            "gpuUtilization": Gauge("rlkube_gpu_utilization", "GPU utilization (NVML), 0..1", registry=self.registry),
            "loss": Gauge("rlkube_loss", "Training loss of the last step", registry=self.registry),
            "rewardMean": Gauge("rlkube_reward_mean", "Mean reward (DPO: chosen implicit reward)", registry=self.registry),
        }
        self._extra: dict[str, Gauge] = {}
        self.tokens = Counter("rlkube_tokens", "Non-pad tokens trained on", registry=self.registry)
        self._gauges["totalSteps"].set(total_steps)

    def update(self, tokens: int = 0, extra: dict[str, float] | None = None, **fields) -> None:
        with self._lock:
            for key, value in fields.items():
                if key not in FIELDS:
                    raise KeyError(f"progress field {key!r} is not one of {FIELDS}")
                self._state[key] = value
                if key in self._gauges and isinstance(value, (int, float)):
                    self._gauges[key].set(value)
            for key, value in (extra or {}).items():
                if key not in self._extra:
                    self._extra[key] = Gauge(f"rlkube_{key}", key.replace("_", " "), registry=self.registry)
                self._extra[key].set(value)
            if tokens:
                self.tokens.inc(tokens)

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._state)


def _handler(progress: Progress | None):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._send(200, b"ok", "text/plain")
            elif path == "/progress" and progress is not None:
                self._send(200, json.dumps(progress.snapshot()).encode(), "application/json")
            elif path == "/metrics" and progress is not None:
                self._send(200, generate_latest(progress.registry), CONTENT_TYPE_LATEST)
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # polled every few seconds: keep the logs clean
            pass

    return Handler


class ProgressServer:
    """Serves `progress` (or /healthz only, when None) on `port` until stopped."""

    def __init__(self, progress: Progress | None, port: int, host: str = "0.0.0.0") -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(progress))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="rlkube-progress", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
