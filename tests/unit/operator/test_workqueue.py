"""The reconcile work queue (per-job serialised, coalescing, retrying) and the health endpoint."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request

from rlkube.operator.handlers import WorkQueue
from rlkube.operator.kubeapi import ApiError, Conflict
from rlkube.operator.lifecycle import Decision
from rlkube.operator.metrics import Metrics, serve


class FakeReconciler:
    """Records calls; each call takes `delay` seconds and returns the next scripted outcome."""

    def __init__(self, outcomes=None, delay=0.05):
        self.metrics = Metrics()
        self.calls: list[tuple[str, str, bool]] = []
        self.outcomes = list(outcomes or [])
        self.delay = delay
        self.active: dict[str, int] = {}
        self.max_parallel_same_job = 0
        self.lock = threading.Lock()

    def reconcile(self, namespace, name, poll=False):
        with self.lock:
            self.active[name] = self.active.get(name, 0) + 1
            self.max_parallel_same_job = max(self.max_parallel_same_job, self.active[name])
            self.calls.append((namespace, name, poll))
            outcome = self.outcomes.pop(0) if self.outcomes else Decision(status={})
        time.sleep(self.delay)
        with self.lock:
            self.active[name] -= 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def run(coro):
    return asyncio.run(coro)


def test_requests_during_a_run_coalesce_into_one_more_run():
    rec = FakeReconciler(delay=0.1)

    async def go():
        q = WorkQueue(rec, workers=4)
        q.request(("ns", "a"))
        await asyncio.sleep(0.02)
        for _ in range(10):
            q.request(("ns", "a"))
        q.request(("ns", "b"), poll=True)
        await asyncio.sleep(0.05)
        await q.drain()
        q.close()

    run(go())
    assert [c[1] for c in rec.calls].count("a") == 2
    assert ("ns", "b", True) in rec.calls
    assert rec.max_parallel_same_job == 1


def test_conflict_retries_at_once_and_errors_back_off():
    rec = FakeReconciler([Conflict(409, "Conflict", "changed"), Decision(status={}),
                          ApiError(500, "InternalError", "boom"), Decision(status={})], delay=0)

    async def go():
        q = WorkQueue(rec, workers=2)
        q.request(("ns", "a"))
        await q.drain()
        assert len(rec.calls) == 2  # conflict: decided again on the spot, in the same run
        q.request(("ns", "a"))
        await q.drain()
        assert len(rec.calls) == 3  # the error: not retried in the same run...
        deadline = time.monotonic() + 5
        while len(rec.calls) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # ...but by the 1 s retry timer
        await q.drain()
        q.close()

    run(go())
    assert len(rec.calls) == 4
    assert rec.metrics.errors.labels(kind="conflict")._value.get() == 1
    assert rec.metrics.errors.labels(kind="api_500")._value.get() == 1


def test_requeue_after_wakes_the_job_and_the_earliest_wins():
    rec = FakeReconciler([Decision(status={}, requeue_after=0.3), Decision(status={})], delay=0)

    async def go():
        q = WorkQueue(rec, workers=2)
        t0 = time.monotonic()
        q.request(("ns", "a"))
        q.request_after(("ns", "a"), 5.0)
        while len(rec.calls) < 2 and time.monotonic() - t0 < 4.0:
            await asyncio.sleep(0.05)
        await q.drain()
        assert len(rec.calls) == 2  # woken by the 0.3 s requeue, well before the 5 s one
        assert time.monotonic() - t0 < 4.0
        q.close()

    run(go())


def test_health_ready_and_metrics_endpoint():
    metrics = Metrics()
    metrics.observe_reconcile("create", 0.02)
    server = serve(metrics, 0, "127.0.0.1", max_beat_age=0.5)
    port = server.server_address[1]

    def get(path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        assert get("/healthz")[0] == 200
        assert get("/readyz")[0] == 503
        metrics.ready = True
        assert get("/readyz")[0] == 200
        code, text = get("/metrics")
        assert code == 200 and 'rlkube_operator_reconciles_total{action="create"} 1.0' in text
        assert "rlkube_operator_reconcile_seconds_bucket" in text
        time.sleep(0.6)  # no heartbeat: the event loop looks stalled
        assert get("/healthz")[0] == 503
    finally:
        server.shutdown()
