"""kopf wiring: watch events become reconcile requests; a work queue runs them.

The handlers are thin on purpose. A job event (including kopf's initial listing at start-up,
which is how a restarted operator resumes every job) and an event of any pod labelled
`rlkube.io/job` request a reconcile of that job; nothing else happens in a handler. Pod events
come from the GPU inventory's pod watch (cluster_state.py), which sees every pod anyway, or,
with a listed inventory, from a kopf handler. The
`WorkQueue` runs at most one reconcile per job at a time on a thread pool, coalesces the
requests that arrive meanwhile into one more run, retries conflicts at once and errors with
backoff, and wakes a job when its decision asks (`requeue_after`: restart backoff, gang timeout,
deadline, TTL). A resync loop requests every job every `resync_seconds`, which also polls
rank 0's /progress, and catches anything a watch missed.

Level-triggered `kopf.on.event` handlers need no state of kopf's on the job: no
last-handled-configuration annotation, no progress in status, and no finalizer (kopf adds one
for timers and daemons, which is why the periodic work lives in the resync loop instead).
Events are posted by the reconciler itself, through the API, because kopf's event poster is
bound to its per-object tasks and the resync loop runs outside them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable

import kopf

from rlkube.operator.api import GROUP, PLURAL, VERSION
from rlkube.operator.api.observed import LABEL_JOB
from rlkube.operator.controller.cluster_state import JobStore, PodStore
from rlkube.operator.controller.kubeapi import ApiError, Conflict
from rlkube.operator.controller.metrics import Metrics
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.render.cleanup import LABEL_CLEANUP

logger = logging.getLogger("rlkube.operator")

Key = tuple[str, str]  # (namespace, name)

ERROR_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)


class WorkQueue:
    """Per-job serialised, coalescing reconcile requests on an asyncio loop.

    At most `workers` reconciles run at once; when more wait, a job woken by an event (its own, a
    pod's, a timer) goes before one the resync asked for (`background`), first come first served
    within each, and the resync's take at most a quarter of the slots: at a thousand jobs the
    resync asks for every one of them every few seconds, and a new job must neither queue behind
    them for its admission nor wait on an API server busy with their reads."""

    def __init__(self, reconciler: Reconciler, workers: int = 16, metrics: Metrics | None = None) -> None:
        self.reconciler = reconciler
        self.metrics = metrics or reconciler.metrics
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._pending: dict[Key, bool] = {}     # key -> poll progress on the next run
        self._background: set[Key] = set()      # pending keys only the resync asked for
        self._running: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self._free = workers                    # reconcile slots not taken
        # The resync's reconciles run on at most this many slots at once: they fill idle capacity
        # without loading the API server with reads while jobs arrive (they lag instead).
        self.background_workers = max(1, workers // 4)
        self._background_running = 0
        self._waiters: list[tuple[int, int, asyncio.Future]] = []  # heap: (background?, arrival, waiter)
        self._waiting: dict[Key, asyncio.Future] = {}
        self._arrivals = itertools.count()
        self._since: dict[Key, int] = {}        # pending key -> when it was first requested

    def request(self, key: Key, poll: bool = False, background: bool = False) -> None:
        """Reconcile `key` soon (once more after the current run, if one is running);
        `background`: only after the jobs woken by events."""
        if not background:
            self._background.discard(key)
            waiter = self._waiting.get(key)
            if waiter is not None and not waiter.done():  # waiting in the background: move it up
                heapq.heappush(self._waiters, (0, next(self._arrivals), waiter))
                self._grant()
        elif key not in self._pending:
            self._background.add(key)
        if key not in self._pending:
            self._since[key] = next(self._arrivals)
        self._pending[key] = self._pending.get(key, False) or poll
        if key not in self._running:
            self._running.add(key)
            task = asyncio.get_running_loop().create_task(self._work(key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.metrics.queue_depth.set(len(self._running))

    def request_after(self, key: Key, seconds: float) -> None:
        """Reconcile `key` in `seconds` (the earliest of several such requests wins)."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, seconds)
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.request(key)

    def forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._failures.pop(key, None)

    async def _slot(self, key: Key) -> bool:
        """Wait for a reconcile slot, in the order of the class docstring; True: it is taken as a
        background one (the resync's), which counts against `background_workers`."""
        background = key in self._background
        if self._free > 0 and not (background and self._background_running >= self.background_workers):
            self._free -= 1
            self._background_running += background
            return background
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        since = self._since.pop(key, None)
        heapq.heappush(self._waiters, (int(background), next(self._arrivals) if since is None else since, waiter))
        try:
            return await waiter
        finally:
            self._waiting.pop(key, None)

    def _release(self, background: bool) -> None:
        self._free += 1
        self._background_running -= background
        self._grant()

    def _grant(self) -> None:
        """Free slots to the first waiters (a moved-up waiter is in the heap twice: once is enough)."""
        while self._free > 0 and self._waiters:
            priority, _, waiter = self._waiters[0]
            if waiter.done():
                heapq.heappop(self._waiters)
                continue
            if priority and self._background_running >= self.background_workers:
                return  # only background waiters are left, and their share is taken
            heapq.heappop(self._waiters)
            self._free -= 1
            self._background_running += priority
            waiter.set_result(bool(priority))

    async def _work(self, key: Key) -> None:
        loop = asyncio.get_running_loop()
        namespace, name = key
        try:
            while key in self._pending:
                background = await self._slot(key)
                self._since.pop(key, None)
                poll = self._pending.pop(key)
                self._background.discard(key)
                try:
                    decision = await loop.run_in_executor(self.executor, self.reconciler.reconcile, namespace, name, poll)
                except Conflict:
                    # The job changed after it was read: decide again on the new version, now.
                    self.metrics.observe_error("conflict")
                    self._pending.setdefault(key, poll)
                    continue
                except Exception as exc:
                    count = self._failures.get(key, 0)
                    self._failures[key] = count + 1
                    delay = ERROR_RETRY_SECONDS[min(count, len(ERROR_RETRY_SECONDS) - 1)]
                    kind = f"api_{exc.status}" if isinstance(exc, ApiError) else type(exc).__name__
                    self.metrics.observe_error(kind)
                    logger.warning("%s/%s: reconcile failed (%s), retrying in %.0fs: %s", namespace, name, kind,
                                   delay, exc, exc_info=not isinstance(exc, ApiError))
                    self.request_after(key, delay)
                    continue
                finally:
                    self._release(background)
                self._failures.pop(key, None)
                if decision is None:
                    self.forget(key)
                elif decision.requeue_after is not None:
                    self.request_after(key, decision.requeue_after)
        finally:
            self._running.discard(key)
            self.metrics.queue_depth.set(len(self._running))
            if key in self._pending:  # a request raced the exit of the loop above
                self.request(key, self._pending.pop(key), background=key in self._background)

    async def off_loop(self, call: Callable[..., object], *args: object) -> None:
        """Run a blocking API call on the worker threads; an error is logged, never raised into kopf."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, call, *args)
        except Exception as exc:
            self.metrics.observe_error(type(exc).__name__)
            logger.warning("%s failed: %s", getattr(call, "__name__", call), exc)

    async def drain(self) -> None:
        """Wait for the running reconciles (used at shutdown and by tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)


async def resync_loop(queue: WorkQueue, list_jobs: Callable[[], Iterable[Key]], seconds: float,
                      metrics: Metrics) -> None:
    """Request every job every `seconds`, polling progress; beats the liveness heartbeat."""
    loop = asyncio.get_running_loop()
    while True:
        metrics.beat()
        try:
            keys = await loop.run_in_executor(queue.executor, lambda: list(list_jobs()))
            for key in keys:
                queue.request(key, poll=True, background=True)
        except Exception as exc:
            metrics.observe_error("resync")
            logger.warning("resync: listing jobs failed: %s", exc)
        await asyncio.sleep(seconds)


def build_registry(queue: WorkQueue, pod_events: bool = True, job_events: bool = True) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers (explicit, so nothing registers on import).
    `pod_events`/`job_events` False: the events of rlkube pods and checkpoint cleanup pods, and of
    RLTrainingJobs, come from the inventory's watches instead (`follow_inventory_pods`,
    `follow_inventory_jobs`), so the operator does not watch and decode them twice, nor pay kopf's
    per-event diff and deep copy."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs):  # the official client's loaders: in-cluster or $KUBECONFIG
        return kopf.login_via_client(**kwargs)

    if job_events:
        @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
        async def job_event(event, name, namespace, body, **_):
            if event.get("type") == "DELETED":
                queue.forget((namespace, name))
                # Its hostPath checkpoint folders go with it (cleanup.py); the job's last state says where.
                await queue.off_loop(queue.reconciler.clean_checkpoints, dict(body))
                return
            queue.request((namespace, name))

    if pod_events:
        # kopf filters labels on its side: this handler alone has it watch (and diff) every pod.
        @kopf.on.event("", "v1", "pods", labels={LABEL_CLEANUP: kopf.PRESENT}, registry=registry)
        async def cleanup_pod_event(event, body, **_):
            if event.get("type") != "DELETED":
                await queue.off_loop(queue.reconciler.remove_cleanup_pod, dict(body))

        @kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, registry=registry)
        async def pod_event(namespace, labels, **_):
            queue.request((namespace, labels[LABEL_JOB]))

    return registry


def follow_inventory_pods(queue: WorkQueue, pods: PodStore, namespaces: Iterable[str] = ()) -> None:
    """Each event of a pod labelled rlkube.io/job in `namespaces` (empty: all) that the inventory's
    pod watch receives requests its job's reconcile, as kopf's pod handler would, and a checkpoint
    cleanup pod that ended is removed, as kopf's cleanup handler would (called on the watch's
    thread: handed to the event loop)."""
    loop = asyncio.get_running_loop()
    watched = frozenset(namespaces)

    def on_pod(key: Key) -> None:
        if not watched or key[0] in watched:
            loop.call_soon_threadsafe(queue.request, key)

    def remove(pod: dict) -> None:
        task = loop.create_task(queue.off_loop(queue.reconciler.remove_cleanup_pod, pod))
        queue._tasks.add(task)
        task.add_done_callback(queue._tasks.discard)

    def on_cleanup_pod(pod: dict) -> None:
        if not watched or (pod.get("metadata") or {}).get("namespace") in watched:
            loop.call_soon_threadsafe(remove, pod)

    pods.listener = on_pod
    pods.cleanup_listener = on_cleanup_pod


def follow_inventory_jobs(queue: WorkQueue, stores: Iterable[JobStore]) -> None:
    """Each event of the inventory's RLTrainingJob watches, and each job of their (re)lists (as
    kopf's initial listing did at start-up), requests that job's reconcile; a deleted job's hostPath
    checkpoints are cleaned from its last state. An event that only echoes the operator's own status
    write (the resourceVersion that write returned) requests nothing: the reconcile that wrote it
    decided on exactly that job, and pod changes since come with events of their own."""
    loop = asyncio.get_running_loop()
    reconciler = queue.reconciler

    def deleted(key: Key, body: dict) -> None:
        queue.forget(key)
        task = loop.create_task(queue.off_loop(reconciler.clean_checkpoints, body))
        queue._tasks.add(task)
        task.add_done_callback(queue._tasks.discard)

    def on_job(kind: str, obj: dict) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        if kind == "DELETED":
            loop.call_soon_threadsafe(deleted, key, obj)
        elif not (kind == "MODIFIED" and reconciler.own_write(key, meta.get("resourceVersion"))):
            loop.call_soon_threadsafe(queue.request, key)

    for store in stores:
        store.listener = on_job
        with store.lock:  # listed before this was set (the operator syncs the inventory first)
            listed = list(store.keys)
        for key in listed:
            queue.request(key)
