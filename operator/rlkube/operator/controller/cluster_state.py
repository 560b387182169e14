"""The GPU inventory plans are made on, fed from the API: kept by watches (`WatchedInventory`), or
listed (`ListedInventory`). What it holds and how it is summed is `planning/inventory.py`'s public
interface; this module only keeps it up to date.

A plan needs every node, the GPUs every unfinished pod of the cluster holds or is planned to take,
and the jobs waiting ahead of it. Listing all of that for each plan costs more with every pod the
cluster holds (at 1,000 jobs x 8 pods, tens of MB decoded per plan: issue 20's profile), so the
operator keeps it instead: one list and then a watch each of nodes, pods and
RLTrainingJobs (watch.py), reduced as events arrive (pods to `inventory.PodUse`, jobs to
`inventory.WaitingJob`, nodes to `inventory.reduce_node`) and summed per node (`inventory.GpuUse`).
A plan then costs one pass over the nodes, not a decode of the cluster.

What a watch cannot know yet is the operator's own plans: the pods of a plan made a moment ago
may not have been created, or their ADDED events not delivered, when the next job plans. Both
inventories keep a ledger of them: a plan's pods are recorded before the planning lock is
released and count until the store has the pod (same attempt), so two jobs planned back to back
never get the same GPUs; a job with pods in the store or the ledger is not waiting for a plan
either. A ledger entry whose create finished but never showed up (created and deleted between
two lists, or refused) is dropped after `LEDGER_GRACE` seconds or at the next full list.

The same watches serve a reconcile's reads (reconcile.py): the job as last seen (or as the
operator's own status write returned it, so the next reconcile never decides on the version
before its own write), and the job's pods, reduced to what a decision reads. A read the store
cannot answer safely goes to the API server instead: a job not in the store, a job whose status
write met a Conflict (the store may be behind), and a job with a pod in the ledger that the
store does not show yet (expectations, as client-go controllers keep them: a gang just created is
never read as missing). Creates use deterministic names, so a store that lags in any other way
costs an AlreadyExists, never a second pod.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from rlkube.operator.api import GROUP, PLURAL, VERSION, parse_spec
from rlkube.operator.api.observed import GANG_GATE, gang_gated
from rlkube.operator.controller.kubeapi import ApiError, KubeAPI
from rlkube.operator.controller.watch import Reflector
from rlkube.operator.planning.inventory import (
    GpuUse,
    InventorySnapshot,
    Key,
    NodeCatalog,
    PodUse,
    WaitingJob,
    pod_use,
    reduce_node,
    snapshot_from_objects,
    waiting_job,
    waiting_jobs,
)
from rlkube.operator.render.cleanup import LABEL_CLEANUP
from rlkube.runtime.contract.pod import LABEL_ATTEMPT

LEDGER_GRACE = 30.0
SYNC_WAIT_SECONDS = 30.0


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class PlanningTurns:
    """The lock plans are made under, given to the oldest job waiting for it (by the queue's order,
    planning/fifo.py) instead of to whichever thread the OS wakes. A plan first serves every older
    job still waiting (fifo.held_back: one placement each, milliseconds apiece on a thousand nodes),
    so when a dozen reconciles want to plan at once, oldest first leaves the fewest ahead of each."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._queue: list[tuple[Any, int]] = []  # heap of (order, arrival)
        self._arrivals = 0

    @contextlib.contextmanager
    def turn(self, order: Any) -> Iterator[None]:
        with self._cond:
            self._arrivals += 1
            mine = (order, self._arrivals)
            heapq.heappush(self._queue, mine)
            while self._held or self._queue[0] != mine:
                self._cond.wait()
            heapq.heappop(self._queue)
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify_all()


class Ledger:
    """Pods this operator decided to create, counted until the inventory has them."""

    def __init__(self) -> None:
        self._entries: dict[Key, list] = {}  # key -> [create finished at (None: not yet), PodUse]
        self._lock = threading.Lock()

    def record(self, pods: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for pod in pods:
                use = pod_use(pod)
                self._entries[use.key] = [None, use]

    def settle(self, pods: Iterable[Mapping[str, Any]]) -> None:
        now = time.monotonic()
        with self._lock:
            for pod in pods:
                entry = self._entries.get(_key(pod))
                if entry is not None:
                    entry[0] = now

    def forget_settled_before(self, when: float) -> None:
        with self._lock:
            self._entries = {k: v for k, v in self._entries.items() if v[0] is None or v[0] >= when}

    def pending(self, known: Mapping[Key, PodUse]) -> tuple[PodUse, ...]:
        """Entries `known` (the store) does not have at their attempt yet; the others are dropped."""
        expired = time.monotonic() - LEDGER_GRACE
        with self._lock:
            keep = {}
            for key, (settled, use) in self._entries.items():
                seen = known.get(key)
                if (seen is not None and seen.attempt == use.attempt) or (settled is not None and settled < expired):
                    continue
                keep[key] = [settled, use]
            self._entries = keep
            return tuple(use for _, use in keep.values())

    def awaits(self, namespace: str, job: str, known: Mapping[Key, PodUse]) -> bool:
        """Whether a pod of `job` this operator created is not in `known` (the store) at its attempt yet."""
        with self._lock:
            return any(use.job == job and key[0] == namespace and (known.get(key) is None
                                                                     or known[key].attempt != use.attempt)
                       for key, (_, use) in self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)


def reduce_job_pod(obj: Mapping[str, Any]) -> dict:
    """The fields of an rlkube pod that a reconcile reads (observed.PodView, inventory.pod_use,
    owned_by): kept for every such pod, so a reconcile reads its job's pods here, not from a LIST."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    kept_meta = ("name", "namespace", "uid", "labels", "annotations", "ownerReferences", "deletionTimestamp",
                 "resourceVersion", "creationTimestamp")
    containers = lambda key: [{"name": c.get("name"), "resources": c.get("resources") or {}}  # noqa: E731
                              for c in spec.get(key) or []]
    reduced_spec = {k: spec[k] for k in ("nodeName", "schedulingGates") if k in spec}
    return {"metadata": {k: meta[k] for k in kept_meta if k in meta},
            "spec": {**reduced_spec, "containers": containers("containers"), "initContainers": containers("initContainers")},
            "status": obj.get("status") or {}}


class PodStore:
    """The unfinished pods of every namespace, reduced, with their GPUs summed (a watch's store)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.use = GpuUse()
        self.lock = threading.Lock()
        self.ledger = ledger
        # rlkube pods (label rlkube.io/job), finished ones too, reduced: (namespace, job) -> name -> pod
        self.by_job: dict[Key, dict[str, dict]] = {}
        # Called (on the watch's thread) with each rlkube pod event's (namespace, job name): the
        # operator requests that job's reconcile from here instead of watching the pods twice.
        self.listener: Callable[[Key], None] | None = None
        # Called likewise with every checkpoint cleanup pod (cleanup.py) that is not deleted yet.
        self.cleanup_listener: Callable[[dict], None] | None = None
        # Pods whose gang gate this operator removed (its PATCH answered 200) while the store may
        # still show them gated: (namespace, name) -> (uid or None, attempt label, recorded at).
        self.ungated: dict[Key, tuple[str | None, str | None, float]] = {}

    def replace(self, items: list[dict]) -> None:
        started = time.monotonic()
        fresh, by_job = GpuUse(), {}
        for obj in items:
            use = pod_use(obj)
            fresh.put(use)
            if use.job:
                by_job.setdefault((use.key[0], use.job), {})[use.key[1]] = reduce_job_pod(obj)
        with self.lock:
            self.use, self.by_job = fresh, by_job
            self.ungated = {}  # a relist may predate a removal: at worst a removal is sent again
        if self.ledger is not None:  # a list begun after a create finished has that pod, or it is gone
            self.ledger.forget_settled_before(started)

    def apply(self, kind: str, obj: dict) -> None:
        use = pod_use(obj)
        with self.lock:
            if kind == "DELETED" or use.finished:
                self.use.drop(use.key)
            else:
                self.use.put(use)
            if use.key in self.ungated and (kind == "DELETED" or not gang_gated(obj)):
                del self.ungated[use.key]  # the watch caught up with the removal (or the pod went)
            if use.job and kind == "DELETED":
                pods = self.by_job.get((use.key[0], use.job), {})
                pods.pop(use.key[1], None)
                if not pods:
                    self.by_job.pop((use.key[0], use.job), None)
            elif use.job:
                self.by_job.setdefault((use.key[0], use.job), {})[use.key[1]] = reduce_job_pod(obj)
        if self.listener is not None and use.job:
            self.listener((use.key[0], use.job))
        if (self.cleanup_listener is not None and kind != "DELETED"
                and LABEL_CLEANUP in ((obj.get("metadata") or {}).get("labels") or {})):
            self.cleanup_listener(obj)

    def gate_removed(self, pod: Mapping[str, Any]) -> None:
        """This operator removed `pod`'s gang gate (`pod`: the PATCH's answer, or at least its
        name, namespace and attempt label). Until the watch shows it, the store's gated copy is
        read as ungated (`job_pods`), so a reconcile in between does not send the removal again
        (issue 20's 17:00 run: 2,704 such PATCHes, a third of the gate removals). A scheduling
        gate can never be added back to a pod, so a removal the API server confirmed stays true
        for that pod (same uid) for good."""
        meta = pod.get("metadata") or {}
        with self.lock:
            self.ungated[_key(pod)] = (meta.get("uid") or None, (meta.get("labels") or {}).get(LABEL_ATTEMPT),
                                       time.monotonic())

    def as_removed(self, reduced: dict) -> dict:
        """`reduced` (a store pod; caller holds the lock), with the gang gate off where this
        operator's removal of it is not in the store yet."""
        expected = self.ungated.get(_key(reduced))
        if expected is None or not gang_gated(reduced):
            return reduced
        meta = reduced["metadata"]
        uid, attempt, at = expected
        if (uid is not None and meta.get("uid") != uid) or (meta.get("labels") or {}).get(LABEL_ATTEMPT) != attempt \
                or time.monotonic() - at > LEDGER_GRACE:
            return reduced  # another pod of that name, or a watch far behind: as the store says
        gates = [g for g in reduced["spec"].get("schedulingGates") or () if g.get("name") != GANG_GATE]
        return {**reduced, "spec": {**reduced["spec"], "schedulingGates": gates}}


class NodeStore:
    """The nodes, reduced, and the planning catalog made of them (inventory.NodeCatalog): made on
    the first plan after an event changed a reduced node, and kept by every plan until then."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.lock = threading.Lock()
        self._catalog: NodeCatalog | None = None
        self.catalogs = 0  # catalogs made (one per change of the nodes that a plan saw)

    def replace(self, items: list[dict]) -> None:
        fresh = {n["metadata"]["name"]: reduce_node(n) for n in items}
        with self.lock:
            self.nodes = fresh
            self._catalog = None

    def apply(self, kind: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                if self.nodes.pop(name, None) is not None:
                    self._catalog = None
                return
            reduced = reduce_node(obj)
            if self.nodes.get(name) != reduced:
                self.nodes[name] = reduced
                self._catalog = None

    def catalog(self) -> NodeCatalog:
        with self.lock:
            if self._catalog is None:
                self._catalog = NodeCatalog(self.nodes.values())
                self.catalogs += 1
            return self._catalog


class JobStore:
    """RLTrainingJobs reduced to whether (and how) they wait for a plan (planning/fifo.py).
    A spec is parsed once per (uid, generation): status writes do not parse it again."""

    def __init__(self) -> None:
        self.waiting: dict[Key, WaitingJob] = {}
        self.keys: set[Key] = set()  # every job of the store (the resync requests them all)
        self.objects: dict[Key, dict] = {}  # every job as last seen (what a reconcile reads)
        self._specs: dict[str, tuple[int, Any]] = {}  # uid -> (generation, spec)
        self.lock = threading.Lock()
        # Called (on the watch's thread) with each event's type and job, and with "LISTED" and
        # every job of a (re)list: the operator requests reconciles from here instead of kopf's
        # own watch of the same jobs (handlers.follow_inventory_jobs).
        self.listener: Callable[[str, dict], None] | None = None

    def _parse(self, obj: Mapping[str, Any]) -> Any:
        meta = obj.get("metadata") or {}
        uid, generation = meta.get("uid") or "", int(meta.get("generation") or 0)
        cached = self._specs.get(uid)
        if cached is None or cached[0] != generation:
            cached = (generation, parse_spec(obj.get("spec") or {}))
            self._specs[uid] = cached
        return cached[1]

    def _reduce(self, obj: Mapping[str, Any]) -> WaitingJob | None:
        return waiting_job(obj, self._parse)

    def replace(self, items: list[dict]) -> None:
        with self.lock:
            uids = {(o.get("metadata") or {}).get("uid") for o in items}
            self._specs = {uid: spec for uid, spec in self._specs.items() if uid in uids}
            self.waiting = {_key(o): w for o in items if (w := self._reduce(o)) is not None}
            self.keys = {_key(o) for o in items}
            self.objects = {_key(o): o for o in items}
        if self.listener is not None:
            for obj in items:
                self.listener("LISTED", obj)

    def apply(self, kind: str, obj: dict) -> None:
        with self.lock:
            self._put(kind, obj)
        if self.listener is not None:
            self.listener(kind, obj)

    def _put(self, kind: str, obj: dict) -> None:
        key = _key(obj)
        reduced = None if kind == "DELETED" else self._reduce(obj)
        if kind == "DELETED":
            self._specs.pop((obj.get("metadata") or {}).get("uid"), None)
            self.keys.discard(key)
            self.objects.pop(key, None)
        else:
            self.keys.add(key)
            self.objects[key] = obj
        if reduced is None:
            self.waiting.pop(key, None)
        else:
            self.waiting[key] = reduced

    def wrote(self, read_version: str, written: dict) -> None:
        """The operator wrote `written` (its status write's answer) over the version `read_version`
        it had read: the store takes it now, unless the watch brought another version since. The
        next reconcile then reads what was written, not the version before it, even before the
        watch's echo arrives (that echo requests nothing: handlers.follow_inventory_jobs)."""
        with self.lock:
            seen = self.objects.get(_key(written))
            if seen is not None and str((seen.get("metadata") or {}).get("resourceVersion")) == read_version:
                self._put("MODIFIED", written)


class WatchedInventory:
    """Nodes, unfinished pods and RLTrainingJobs kept by watches (see the module docstring).

    `job_namespaces`: the namespaces whose jobs queue together (the operator's watched ones);
    empty: all namespaces."""

    # A watch lags the API server a little: a decision that restarts a healthy gang because of the
    # inventory is confirmed on `snapshot(fresh=True)`, a listing (reconcile.py).
    is_fresh = False

    def __init__(self, api: KubeAPI, job_namespaces: Iterable[str] = (), seconds: int = 300) -> None:
        self.api = api
        self.ledger = Ledger()
        self.pods, self.nodes = PodStore(self.ledger), NodeStore()
        namespaces = list(job_namespaces)
        job_paths = ([f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}" for ns in namespaces]
                     or [f"/apis/{GROUP}/{VERSION}/{PLURAL}"])
        self.jobs_by_ns = [JobStore() for _ in job_paths]
        self.reflectors = [
            Reflector(api, "/api/v1/nodes", self.nodes, seconds=seconds, name="nodes"),
            # Every pod, finished ones too: their events (a failed pod deleted, say) wake their job.
            Reflector(api, "/api/v1/pods", self.pods, seconds=seconds, name="pods"),
            *(Reflector(api, path, store, seconds=seconds, name=f"rltrainingjobs{i}")
              for i, (path, store) in enumerate(zip(job_paths, self.jobs_by_ns, strict=True))),
        ]
        # namespace ("" for all) -> its jobs' store and that store's watch
        self._job_stores = {ns: (store, reflector) for ns, store, reflector
                            in zip(namespaces or [""], self.jobs_by_ns, self.reflectors[2:], strict=True)}

    def start(self) -> WatchedInventory:
        for reflector in self.reflectors:
            reflector.start()
        return self

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in self.reflectors)

    def stop(self) -> None:
        for reflector in self.reflectors:
            reflector.stop()

    def job_keys(self) -> list[Key]:
        """Every RLTrainingJob the job watches hold (the resync's list, with no request)."""
        keys: list[Key] = []
        for store in self.jobs_by_ns:
            with store.lock:
                keys.extend(store.keys)
        return keys

    def _job_store(self, namespace: str) -> JobStore | None:
        """The store of `namespace`'s jobs, once its watch has listed; None otherwise."""
        found = self._job_stores.get(namespace) or self._job_stores.get("")
        return found[0] if found is not None and found[1].synced.is_set() else None

    def job_object(self, namespace: str, name: str) -> dict | None:
        """The job as the job watch last saw it (or as this operator last wrote it); None when the
        store does not hold it (not listed yet, or gone): the caller reads the API server."""
        store = self._job_store(namespace)
        if store is None:
            return None
        with store.lock:
            return store.objects.get((namespace, name))

    def job_pods(self, namespace: str, name: str) -> list[dict] | None:
        """The job's pods (label rlkube.io/job=name, reduced) as the pod watch holds them; None
        while a pod this operator created is not in the store yet (the ledger says so): a stale
        list must not hide a gang just made, so the caller LISTs then."""
        if not self.reflectors[1].synced.is_set():
            return None
        with self.pods.lock:
            if self.ledger.awaits(namespace, name, self.pods.use.pods):
                return None
            return [self.pods.as_removed(p) for p in (self.pods.by_job.get((namespace, name)) or {}).values()]

    def wrote_job(self, read_version: str, written: dict | None) -> None:
        store = self._job_store(((written or {}).get("metadata") or {}).get("namespace") or "")
        if written and store is not None:
            store.wrote(read_version, written)

    def record(self, pods: list[dict]) -> None:
        self.ledger.record(pods)

    def settle(self, pods: list[dict]) -> None:
        self.ledger.settle(pods)

    def gate_removed(self, pod: Mapping[str, Any]) -> None:
        self.pods.gate_removed(pod)

    def invalidate(self) -> None:
        """Creates ended in an error: nothing to do, the watch shows what was made."""

    def _waiting(self, active: Mapping[str, int], extra: Iterable[PodUse]) -> tuple[WaitingJob, ...]:
        planned = {uid for use in extra for uid in use.owners}
        waiting = []
        for store in self.jobs_by_ns:
            with store.lock:
                waiting.extend(w for w in store.waiting.values() if w.uid not in active and w.uid not in planned)
        return tuple(sorted(waiting, key=lambda w: w.order))

    def snapshot(self, namespace: str = "", fresh: bool = False) -> InventorySnapshot:
        """What a plan is made on now; `fresh`: nodes and pods listed now, not the watches' copy.
        Raises while the watches have not listed yet (the reconcile is retried with backoff)."""
        if not self.wait_synced(SYNC_WAIT_SECONDS):
            raise RuntimeError("GPU inventory: the node, pod and job watches have not listed yet")
        with self.pods.lock:
            use = self.pods.use
            extra = self.ledger.pending(use.pods)
            active = dict(use.active_owners)
            if not fresh:
                bound, reserved = dict(use.bound), dict(use.reserved)
                owner_bound = {uid: dict(t) for uid, t in use.owner_bound.items()}
                owner_reserved = {uid: dict(t) for uid, t in use.owner_reserved.items()}
        waiting = self._waiting(active, extra)
        if fresh:
            listed = snapshot_from_objects(self.api.list_nodes(), [*self.api.list_bound_pods(),
                                                                     *self.api.list_planned_pods()], waiting)
            return InventorySnapshot(listed.nodes, listed.bound, listed.reserved, listed.owner_bound,
                                     listed.owner_reserved, waiting, extra)
        catalog = self.nodes.catalog()
        return InventorySnapshot(list(catalog.nodes), bound, reserved, owner_bound, owner_reserved, waiting, extra,
                                 catalog=catalog)


class ListedInventory:
    """Nodes, bound pods, unbound rlkube pods and jobs listed at most every `ttl` seconds, plus
    the ledger. For an operator that may not watch (and the unit tests' fake API servers)."""

    def __init__(self, api: KubeAPI, ttl: float = 2.0) -> None:
        self.api = api
        self.ttl = ttl
        self.ledger = Ledger()
        self.is_fresh = False  # whether the last snapshot listed anew
        self._listing: tuple[float, list[dict], list[dict], NodeCatalog] | None = None  # (taken, nodes, pods)
        self._jobs: dict[str, tuple[float, list[WaitingJob]]] = {}

    def snapshot(self, namespace: str = "", fresh: bool = False) -> InventorySnapshot:
        self.is_fresh = fresh or self._listing is None or time.monotonic() - self._listing[0] > self.ttl
        if self.is_fresh:
            started = time.monotonic()
            nodes = self.api.list_nodes()
            self._listing = (started, nodes, [*self.api.list_bound_pods(), *self.api.list_planned_pods()],
                             NodeCatalog(nodes))
            self.ledger.forget_settled_before(started)
        taken, nodes, pods, catalog = self._listing
        listed = snapshot_from_objects(nodes, pods)
        uses = [pod_use(p) for p in pods]
        extra = self.ledger.pending({u.key: u for u in uses})
        planned = {uid for use in (*uses, *extra) if use.active for uid in use.owners}
        waiting = tuple(w for w in self._waiting(namespace, taken) if w.uid not in planned)
        return InventorySnapshot(listed.nodes, listed.bound, listed.reserved, listed.owner_bound,
                                 listed.owner_reserved, waiting, extra, catalog=catalog)

    def _waiting(self, namespace: str, taken: float) -> list[WaitingJob]:
        """The RLTrainingJobs waiting for a plan, listed with the nodes: all namespaces', or
        `namespace`'s where the operator may read only the ones it watches."""
        cached = self._jobs.get(namespace)
        if cached is None or cached[0] != taken:
            try:
                jobs = self.api.list_jobs(None)
            except ApiError as exc:
                if exc.status != 403:
                    raise
                jobs = self.api.list_jobs(namespace)
            cached = (taken, waiting_jobs(jobs))
            self._jobs[namespace] = cached
        return cached[1]

    def job_object(self, namespace: str, name: str) -> dict | None:
        return None  # nothing kept: the reconcile reads the API server

    def job_pods(self, namespace: str, name: str) -> list[dict] | None:
        return None

    def wrote_job(self, read_version: str, written: dict | None) -> None:
        """Nothing kept."""

    def record(self, pods: list[dict]) -> None:
        self.ledger.record(pods)

    def settle(self, pods: list[dict]) -> None:
        self.ledger.settle(pods)

    def gate_removed(self, pod: Mapping[str, Any]) -> None:
        """Nothing kept: a reconcile lists the pods."""

    def invalidate(self) -> None:
        self._listing = None
