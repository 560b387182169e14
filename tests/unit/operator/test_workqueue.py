"""The reconcile work queue (per-job serialised, coalescing, retrying) and the health endpoint."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request

from rlkube.operator.controller.handlers import WorkQueue
from rlkube.operator.controller.kubeapi import ApiError, Conflict
from rlkube.operator.controller.metrics import Metrics, serve
from rlkube.operator.lifecycle import Decision


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


def test_jobs_woken_by_events_go_before_the_resyncs_and_a_resync_request_moves_up_with_an_event():
    reconciler = FakeReconciler(delay=0.05)

    async def main():
        queue = WorkQueue(reconciler, workers=1)
        queue.request(("ns", "busy"))                  # takes the one slot
        for name in ("r1", "r2", "r3"):
            queue.request(("ns", name), poll=True, background=True)
        await asyncio.sleep(0)
        queue.request(("ns", "new"))                   # an event: before the resyncs
        queue.request(("ns", "r3"))                    # r3's job had an event too: moves up
        await queue.drain()
        queue.close()

    run(main())
    assert [name for _, name, _ in reconciler.calls] == ["busy", "new", "r3", "r1", "r2"]
    assert [poll for _, name, poll in reconciler.calls if name.startswith("r")] == [True, True, True]


def test_the_resyncs_reconciles_take_at_most_a_quarter_of_the_slots():
    reconciler = FakeReconciler(delay=0.05)
    running, most = set(), {"resync": 0, "event": 0}
    original = reconciler.reconcile

    all_events_in = threading.Event()  # the 6 events hold their slots until all 6 run at once

    def reconcile(namespace, name, poll=False):
        kind = "resync" if name.startswith("r") else "event"
        with reconciler.lock:
            running.add(name)
            most[kind] = max(most[kind], sum(1 for n in running if (n.startswith("r")) == (kind == "resync")))
            if most["event"] == 6:
                all_events_in.set()
        try:
            if kind == "event":  # bounded: a queue that never runs 6 at once fails the assert below
                all_events_in.wait(timeout=5)
            return original(namespace, name, poll)
        finally:
            with reconciler.lock:
                running.discard(name)

    reconciler.reconcile = reconcile

    async def main():
        queue = WorkQueue(reconciler, workers=8)
        for i in range(6):
            queue.request(("ns", f"r{i}"), poll=True, background=True)
        for i in range(6):
            queue.request(("ns", f"e{i}"))
        await queue.drain()
        queue.close()

    run(main())
    assert most == {"resync": 2, "event": 6} and len(reconciler.calls) == 12
