"""Rank 0's HTTP endpoint: /progress (JSON), /metrics (Prometheus), /healthz.

The operator polls /progress on a timer and writes status.progress; Prometheus scrapes
/metrics. Other ranks serve /healthz only, on the same port. The server is the standard
library's ThreadingHTTPServer on a daemon thread: the training loop only updates a
`Progress` object under a lock, it never waits for a client.

When training ends (finished, stopped or failed) rank 0 also writes its last report as the
container's termination message (`{"progress": {...}}` in /dev/termination-log, which the
kubelet copies into the pod's status). The operator reads it from there, so a run that ends
between two polls, or before the first, still leaves its final step and throughput in
`status.progress`.

The paths, the report's fields and the termination message are the contract's
(`rlkube.runtime.contract.pod`, `rlkube.runtime.contract.progress`); the report also says which
restart attempt (RLKUBE_ATTEMPT) it comes from.
"""

from __future__ import annotations

import json
import math
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rlkube.runtime.contract import failure
from rlkube.runtime.contract import progress as report
from rlkube.runtime.contract.pod import ENV_ATTEMPT, ENV_LOCAL_RANK, HEALTH_PATH, METRICS_PATH, PROGRESS_PATH
from rlkube.runtime.contract.progress import (
    TERMINATION_LOG,
    TERMINATION_LOG_MAX_BYTES,
    TERMINATION_MESSAGE_KEY,
)

FIELDS = report.REPORT_FIELDS
# What a termination message over the kubelet's limit leaves out, in this order: the breakdowns
# the operator does not copy, then the memory plan, then the summary (its figures are in the
# trainer's log too).
TRIMMED_FIRST = (report.GPU_BUSY_PHASES, report.PHASE_SECONDS, report.STARTUP_SECONDS, report.MEMORY_PLAN,
                 report.SUMMARY)
# Where a test (or a run outside Kubernetes) has the termination message written instead.
ENV_TERMINATION_LOG = "RLKUBE_TERMINATION_LOG"


def attempt_from_env() -> int | None:
    """The gang restart attempt the operator started this pod for; None outside an operator pod."""
    value = os.environ.get(ENV_ATTEMPT, "")
    return int(value) if value.isdigit() else None


class Progress:
    """The job's current state, shared between the training loop and the HTTP thread."""

    def __init__(self, total_steps: int, attempt: int | None = None, gpus: int | None = None) -> None:
        """`gpus`: the job's world size (one GPU a rank), the divisor of tokens/s/GPU (None: not exported)."""
        self._lock = threading.Lock()
        self._gpus = gpus
        self._state: dict = {k: None for k in FIELDS}
        self._state.update({
            report.PHASE: report.PHASE_STARTING,
            report.STEP: 0,
            report.TOTAL_STEPS: total_steps,
            report.ATTEMPT: attempt if attempt is not None else attempt_from_env(),
        })
        self.registry = CollectorRegistry()
        self._gauges = {
            report.STEP: Gauge("rlkube_step", "Optimizer steps completed", registry=self.registry),
            report.TOTAL_STEPS: Gauge("rlkube_total_steps", "Optimizer steps to run", registry=self.registry),
            report.TOKENS_PER_SECOND: Gauge("rlkube_tokens_per_second", "Non-pad tokens per second",
                                            registry=self.registry),
            report.STEP_SECONDS: Gauge("rlkube_step_seconds", "Wall seconds of the latest optimizer step",
                                       registry=self.registry),
            report.MFU: Gauge("rlkube_mfu", "Model FLOPs utilization against the card's peak", registry=self.registry),
            report.GPU_UTILIZATION: Gauge("rlkube_gpu_utilization", "GPU busy ratio over the last step "
                                          "(NVML sampled at 10 Hz; the least busy rank), 0..1",
                                          registry=self.registry),
            report.LOSS: Gauge("rlkube_loss", "Training loss of the last step", registry=self.registry),
            report.REWARD_MEAN: Gauge("rlkube_reward_mean", "Mean reward (DPO: chosen implicit reward)",
                                      registry=self.registry),
            report.EVAL_STEP: Gauge("rlkube_eval_step", "Optimizer steps done at the latest evaluation",
                                    registry=self.registry),
            report.EVAL_LOSS: Gauge("rlkube_eval_loss", "Loss on the eval set (DPO/KTO)", registry=self.registry),
            report.EVAL_ACCURACY: Gauge("rlkube_eval_accuracy", "Implicit-reward accuracy on the eval set "
                                        "(DPO/KTO), 0..1", registry=self.registry),
            report.EVAL_MARGIN: Gauge("rlkube_eval_margin", "Mean implicit-reward margin on the eval set (DPO/KTO)",
                                      registry=self.registry),
            report.EVAL_REWARD_MEAN: Gauge("rlkube_eval_reward_mean", "Mean reward of greedy completions of the "
                                           "eval prompts (PPO/GRPO; DPO/KTO: chosen implicit reward)",
                                           registry=self.registry),
        }
        self._extra: dict[str, Gauge] = {}
        self.tokens = Counter("rlkube_tokens", "Non-pad tokens trained on", registry=self.registry)
        self.tokens_per_gpu = Gauge("rlkube_tokens_per_second_per_gpu", "Non-pad tokens per second over the "
                                    "job's GPUs (world size)", registry=self.registry)
        self.phase_seconds = Gauge("rlkube_phase_seconds", "Seconds rank 0 spent in each phase of the latest "
                                   "step (a checkpoint save after step N counts in step N+1)", ["phase"],
                                   registry=self.registry)
        # A save's stall is what the step loop waits (the previous write, staging the state); the
        # write itself runs in the background and is not counted.
        self.checkpoint_stall = Gauge("rlkube_checkpoint_last_stall_seconds", "Seconds the step loop waited "
                                      "in the latest checkpoint save", registry=self.registry)
        self.checkpoint_stall_total = Counter("rlkube_checkpoint_stall_seconds", "Seconds the step loop waited "
                                              "in checkpoint saves, all saves of this run", registry=self.registry)
        self.checkpoints = Counter("rlkube_checkpoints", "Checkpoint saves of this run", registry=self.registry)
        self._gauges[report.TOTAL_STEPS].set(total_steps)

    def update(self, tokens: int = 0, extra: dict[str, float] | None = None, **fields) -> None:
        with self._lock:
            for key, value in fields.items():
                if key not in FIELDS:
                    raise KeyError(f"progress field {key!r} is not one of {FIELDS}")
                self._state[key] = value
                if key in self._gauges and isinstance(value, (int, float)):
                    self._gauges[key].set(value)
            self._derived_gauges(fields)
            for key, value in (extra or {}).items():
                if key not in self._extra:
                    self._extra[key] = Gauge(f"rlkube_{key}", key.replace("_", " "), registry=self.registry)
                self._extra[key].set(value)
            if tokens:
                self.tokens.inc(tokens)

    def _derived_gauges(self, fields: dict) -> None:
        """The gauges a field feeds other than its own: tokens/s/GPU, seconds by phase."""
        tps = fields.get(report.TOKENS_PER_SECOND)
        if self._gpus and isinstance(tps, (int, float)):
            self.tokens_per_gpu.set(tps / self._gpus)
        phases = fields.get(report.PHASE_SECONDS)
        if isinstance(phases, dict):
            self.phase_seconds.clear()  # a phase absent from this step holds no stale series
            for phase, seconds in phases.items():
                if isinstance(seconds, (int, float)):
                    self.phase_seconds.labels(phase).set(seconds)

    def observe_checkpoint(self, stall_seconds: float) -> None:
        """One checkpoint save that held the step loop for `stall_seconds`."""
        with self._lock:
            self.checkpoint_stall.set(stall_seconds)
            self.checkpoint_stall_total.inc(stall_seconds)
            self.checkpoints.inc()

    def snapshot(self) -> dict:
        with self._lock:
            return dict(self._state)


def write_termination_message(progress: Progress, path: str | None = None) -> bool:
    """Leave `progress`'s last report as the termination message; False where there is none.

    The path is $RLKUBE_TERMINATION_LOG, else /dev/termination-log when it exists (the kubelet
    creates it in every container; a workstation has none, and nothing is written there).
    """
    path = path or os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG
    if path == TERMINATION_LOG and not os.path.exists(path):
        return False
    # A non-finite loss (the run that failed for it) is no JSON number: it is left out.
    last = {k: v for k, v in progress.snapshot().items() if not (isinstance(v, float) and not math.isfinite(v))}
    body = json.dumps({TERMINATION_MESSAGE_KEY: last}, separators=(",", ":"), default=str)
    for key in TRIMMED_FIRST:  # long paths can make it too long: drop what the status needs least
        if len(body.encode()) <= TERMINATION_LOG_MAX_BYTES:
            break
        last.pop(key, None)
        body = json.dumps({TERMINATION_MESSAGE_KEY: last}, separators=(",", ":"), default=str)
    if len(body.encode()) > TERMINATION_LOG_MAX_BYTES:  # never write a cut JSON
        return False
    try:
        with open(path, "w") as f:
            f.write(body)
    except OSError:
        return False
    return True


def write_termination_error(category: str, error: BaseException | str, field: str = "",
                            path: str | None = None) -> bool:
    """Add why the run failed to the termination message, next to the last report (if one was
    written): `{"error": {"exit": category, "field": ..., "message": one line}}`. False where
    there is no termination log (a workstation) or it cannot be written."""
    path = path or os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG
    if path == TERMINATION_LOG and not os.path.exists(path):
        return False
    try:
        with open(path) as f:
            body = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    line = " ".join(str(error).split())[: failure.ERROR_MESSAGE_MAX_CHARS]
    body[failure.TERMINATION_ERROR_KEY] = {failure.ERROR_EXIT: category, failure.ERROR_FIELD: field,
                                          failure.ERROR_MESSAGE: line}
    text = json.dumps(body, separators=(",", ":"), default=str)
    if len(text.encode()) > TERMINATION_LOG_MAX_BYTES:  # the error matters more than the report
        text = json.dumps({failure.TERMINATION_ERROR_KEY: body[failure.TERMINATION_ERROR_KEY]}, separators=(",", ":"))
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        return False
    return True


class _Handler(BaseHTTPRequestHandler):
    """Reads the server's current `progress` (None: /healthz only) on every request."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        progress = self.server.progress  # type: ignore[attr-defined]
        if path == HEALTH_PATH:
            self._send(200, b"ok", "text/plain")
        elif path == PROGRESS_PATH and progress is not None:
            self._send(200, json.dumps(progress.snapshot()).encode(), "application/json")
        elif path == METRICS_PATH and progress is not None:
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


class ProgressServer:
    """Serves `progress` (or /healthz only, when None) on `port` until stopped.

    A pod's first process starts one before its slow start-up (importing torch, the rendezvous,
    building the model: `serve_health_early`), so the kubelet's probes find it alive from the
    first seconds; the training loop then `attach`es its Progress to that same server.
    """

    def __init__(self, progress: Progress | None, port: int, host: str = "0.0.0.0") -> None:
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.progress = progress  # type: ignore[attr-defined]
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="rlkube-progress", daemon=True)
        self.thread.start()

    def attach(self, progress: Progress | None) -> None:
        self.httpd.progress = progress  # type: ignore[attr-defined]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# The server `serve_health_early` started in this process, for the training loop to adopt.
_early: ProgressServer | None = None


def serve_health_early(port: int) -> ProgressServer | None:
    """Start this process's /healthz now (the pod's first process only: LOCAL_RANK 0)."""
    global _early
    if not port or os.environ.get(ENV_LOCAL_RANK, "0") not in ("", "0") or _early is not None:
        return _early
    try:
        _early = ProgressServer(None, port)
    except OSError:
        _early = None  # the loop tries again and says why
    return _early


def adopt_early_server() -> ProgressServer | None:
    """The early server, handed over once (the loop stops it when training ends)."""
    global _early
    server, _early = _early, None
    return server
