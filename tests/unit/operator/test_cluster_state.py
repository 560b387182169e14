"""The watch-fed GPU inventory (controller/cluster_state.py on planning/inventory.py, fed by
controller/watch.py): events applied, a stale watch relisted, and the operator's own plans
counted before any watch shows their pods."""

from __future__ import annotations

import copy
import http.server
import json
import threading

import pytest
from operator_builders import job, node

from rlkube.operator import lifecycle, render
from rlkube.operator.api import parse_spec
from rlkube.operator.api.observed import GANG_GATE
from rlkube.operator.controller import cluster_state
from rlkube.operator.controller.cluster_state import ListedInventory, PodStore, WatchedInventory
from rlkube.operator.controller.kubeapi import ApiError, KubeAPI
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.controller.watch import Reflector
from rlkube.operator.planning.cluster import cluster_view_of
from rlkube.operator.planning.inventory import pod_use

GPU = "nvidia.com/gpu"


def pod(name: str, gpus: int = 1, node_name: str | None = None, planned: str | None = None, owner: str = "uid-a",
        job_name: str | None = "a", attempt: str = "0", phase: str = "Pending", namespace: str = "team") -> dict:
    labels = {"rlkube.io/attempt": attempt, **({"rlkube.io/job": job_name} if job_name else {})}
    notes = {render.PLANNED_NODE_ANNOTATION: planned, render.GPUS_ANNOTATION: str(gpus)} if planned else {}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": notes,
                         "ownerReferences": [{"uid": owner}]},
            "spec": {**({"nodeName": node_name} if node_name else {}),
                     "containers": [{"name": "trainer", "resources": {"requests": {GPU: str(gpus)}}}]},
            "status": {"phase": phase}}


def test_pod_events_keep_the_gpu_sums_per_node_and_per_owner():
    store = PodStore()
    store.apply("ADDED", pod("a-0", 2, planned="n1"))                  # gated: reserved on its planned node
    assert store.use.reserved == {"n1": 2} and store.use.bound == {} and store.use.active_owners == {"uid-a": 1}
    store.apply("MODIFIED", pod("a-0", 2, node_name="n1", planned="n1", phase="Running"))  # bound
    assert store.use.reserved == {} and store.use.bound == {"n1": 2} and store.use.owner_bound == {"uid-a": {"n1": 2}}
    store.apply("ADDED", pod("other", 3, node_name="n2", owner="uid-x", job_name=None, namespace="x"))
    assert store.use.bound == {"n1": 2, "n2": 3}
    store.apply("MODIFIED", pod("a-0", 2, node_name="n1", planned="n1", phase="Succeeded"))  # holds nothing
    assert store.use.bound == {"n2": 3} and "uid-a" not in store.use.owner_bound and store.use.active_owners == {"uid-x": 1}
    store.apply("DELETED", pod("other", 3, node_name="n2", owner="uid-x", job_name=None, namespace="x"))
    assert store.use.bound == {} and store.use.pods == {} and store.use.active_owners == {}


def test_a_relist_replaces_the_store_and_forgets_plans_whose_create_finished_before_it():
    inventory = WatchedInventory(KubeAPI("http://127.0.0.1:1"))
    inventory.pods.replace([pod("gone", 4, node_name="n1")])
    finished, in_flight = pod("b-0", 1, planned="n2", owner="uid-b", job_name="b"), pod("c-0", 1, planned="n2",
                                                                                        owner="uid-c", job_name="c")
    inventory.record([finished, in_flight])
    inventory.settle([finished])  # created (or refused) before the relist below began
    inventory.pods.replace([pod("kept", 2, node_name="n2", owner="uid-x", job_name=None)])
    assert inventory.pods.use.bound == {"n2": 2}  # the stale pod is gone with the old store
    assert [u.key for u in inventory.ledger.pending(inventory.pods.use.pods)] == [("team", "c-0")]


class ScriptedAPI:
    """list_at and watch answering from scripts: each watch call pops the next list of events
    (an exception in it is raised at that point)."""

    def __init__(self, lists: list[tuple[list[dict], str]], watches: list[list]) -> None:
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []

    def list_at(self, path, query=None, accept=None):
        return self.lists.pop(0)

    def watch(self, path, query, seconds):
        self.watched_from.append(query["resourceVersion"])
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item


def ev(kind: str, obj: dict, version: str) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": obj}


def test_the_reflector_follows_events_resumes_after_a_cut_and_relists_on_410_gone():
    store = PodStore()
    api = ScriptedAPI(
        lists=[([pod("a-0", 1, node_name="n1")], "10"), ([pod("z-0", 5, node_name="n3")], "50")],
        watches=[
            [ev("ADDED", pod("a-1", 1, node_name="n1"), "11"), {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}},
             ConnectionResetError("cut")],                                      # resumed from 15, not relisted
            [ev("DELETED", pod("a-0", 1, node_name="n1"), "16"),
             {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old resource version"}}],
            [ev("ADDED", pod("z-1", 1, node_name="n3"), "51")],
        ])
    reflector = Reflector(api, "/api/v1/pods", store, sleep=lambda seconds: False)
    api.watches.append([])
    original = api.watch

    def watch(path, query, seconds):  # stop once every scripted watch is spent
        if not api.watches[:-1]:
            reflector.stop()
        yield from original(path, query, seconds)

    api.watch = watch
    reflector.run()
    assert api.watched_from == ["10", "15", "50", "51"]
    assert reflector.relists == 2 and reflector.errors == 1 and reflector.synced.is_set()
    assert store.use.bound == {"n3": 6}  # a-1 came before the relist: the relisted store has only n3's pods
    assert sorted(k[1] for k in store.use.pods) == ["z-0", "z-1"]


class FakeCluster:
    """The API calls a reconcile makes, on an in-memory cluster whose watches deliver nothing."""

    def __init__(self, jobs: list[dict]) -> None:
        self.jobs = {j["metadata"]["name"]: j for j in jobs}
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[str, str]] = []

    def get_job(self, namespace, name):
        return copy.deepcopy(self.jobs.get(name))

    def list_pods(self, namespace, selector):
        name = selector.split("=", 1)[1]
        return [copy.deepcopy(p) for p in self.pods.values() if p["metadata"]["labels"].get("rlkube.io/job") == name]

    def patch_job_status(self, namespace, name, resource_version, patch):
        status = self.jobs[name].setdefault("status", {})
        status.update(patch)

    def create(self, obj):
        if obj["kind"] == "Pod":
            self.pods[obj["metadata"]["name"]] = copy.deepcopy(obj)
        return True

    def remove_gate(self, namespace, name, position, gate, attempt):
        self.pods[name]["spec"]["schedulingGates"] = []
        return copy.deepcopy(self.pods[name])

    def post_event(self, involved, type_, reason, message, **kw):
        self.events.append((involved["name"], reason))


def eight_gpu_job(name: str) -> dict:
    obj = job(name, algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 8}, "reference": {"colocateWith": "actor"}})
    obj["metadata"].update(uid=f"uid-{name}", creationTimestamp=f"2026-12-04T00:00:0{name[-1]}Z")
    return obj


def synced(inventory: WatchedInventory) -> WatchedInventory:
    for reflector in inventory.reflectors:
        reflector.synced.set()
    return inventory


def test_jobs_planned_back_to_back_before_any_watch_event_never_share_gpus():
    jobs = [eight_gpu_job(f"j{i}") for i in (1, 2, 3)]
    api = FakeCluster(jobs)
    inventory = synced(WatchedInventory(api))
    inventory.nodes.replace([node("n1", 8), node("n2", 8)])
    inventory.pods.replace([])
    inventory.jobs_by_ns[0].replace(copy.deepcopy(jobs))  # all three wait; no event comes after this
    reconciler = Reconciler(api, lifecycle.Settings(host_path_shared=True), progress=lambda ip, port: None,
                            inventory=inventory)
    planned = {}
    for j in jobs:
        decision = reconciler.reconcile("team", j["metadata"]["name"])
        pods = [o for o in decision.create if o["kind"] == "Pod"]
        planned[j["metadata"]["name"]] = {o["metadata"]["annotations"][render.PLANNED_NODE_ANNOTATION] for o in pods}
    assert planned["j1"] in ({"n1"}, {"n2"}) and planned["j2"] == {"n1", "n2"} - planned["j1"], planned
    assert planned["j3"] == set() and api.jobs["j3"]["status"]["phase"] == "Pending"  # nothing left: no partial gang
    assert not any(p["spec"].get("schedulingGates") for p in api.pods.values())
    assert all(GANG_GATE not in str(p["spec"].get("schedulingGates")) for p in api.pods.values())
    # The watch delivers j1's pods at last: the ledger lets go of them, and the sums hold them instead.
    for obj in api.pods.values():
        if obj["metadata"]["labels"]["rlkube.io/job"] == "j1":
            inventory.pods.apply("ADDED", obj)
    snapshot = inventory.snapshot()
    assert {u.job for u in snapshot.extra} == {"j2"} and snapshot.reserved == {next(iter(planned["j1"])): 8}
    assert [w.name for w in snapshot.waiting] == ["j3"]  # j1 and j2 have gangs: not waiting any more


def test_a_pod_of_an_earlier_attempt_with_the_same_name_does_not_stand_for_the_new_plan():
    inventory = synced(WatchedInventory(KubeAPI("http://127.0.0.1:1")))
    inventory.nodes.replace([node("n1", 8), node("n2", 8)])
    inventory.pods.replace([pod("a-0", 4, node_name="n1", attempt="0", phase="Running")])  # old attempt, going
    inventory.record([pod("a-0", 4, planned="n2", attempt="1")])
    other = cluster_view_of(inventory.snapshot(), parse_spec(job()["spec"]), "uid-b")
    assert {n.name: n.gpus_used for n in other.inventory} == {"n1": 4, "n2": 4}


def test_a_job_spec_is_parsed_once_per_generation(monkeypatch):
    calls = []
    monkeypatch.setattr(cluster_state, "parse_spec", lambda raw: calls.append(1) or parse_spec(raw))
    store = cluster_state.JobStore()
    obj = eight_gpu_job("j1")
    store.apply("ADDED", obj)
    for phase in ("Pending", "Pending", ""):
        obj["status"] = {"phase": phase, "message": f"waiting {phase}"}
        store.apply("MODIFIED", obj)
    assert len(calls) == 1 and list(store.waiting) == [("team", "j1")]
    obj["metadata"]["generation"] = 2
    store.apply("MODIFIED", obj)
    obj["status"] = {"phase": "Scheduling", "placement": {"pods": []}}
    store.apply("MODIFIED", obj)
    assert len(calls) == 2 and store.waiting == {}
    store.apply("DELETED", obj)
    assert store._specs == {}


def test_listed_inventory_counts_in_flight_creates_until_a_later_listing_has_them(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(cluster_state.time, "monotonic", lambda: clock[0])

    class API:
        calls = 0
        planned: list = []

        def list_nodes(self):
            API.calls += 1
            return [node("n1", 8)]

        def list_bound_pods(self):
            return []

        def list_planned_pods(self):
            return list(API.planned)

        def list_jobs(self, namespace):
            return []

    made = pod("j-actor-0", 2, planned="n1")
    inventory = ListedInventory(API(), ttl=1.0)
    assert inventory.snapshot().extra == () and API.calls == 1
    inventory.record([made])
    assert inventory.snapshot().used_by_others("uid-b") == {"n1": 2} and API.calls == 1  # within ttl
    clock[0] += 2
    assert inventory.snapshot().used_by_others("uid-b") == {"n1": 2} and API.calls == 2  # create not done: kept
    inventory.settle([made])
    API.planned = [made]
    clock[0] += 2
    snapshot = inventory.snapshot()
    assert snapshot.extra == () and snapshot.used_by_others("uid-b") == {"n1": 2}  # listed, never twice
    API.planned = []
    clock[0] += 2
    assert inventory.snapshot().used_by_others("uid-b") == {}


class _Stream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        if "resourceVersion=1&" in self.path or self.path.endswith("resourceVersion=1"):
            body = json.dumps({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}).encode()
            self.send_response(410)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        lines = b"".join(json.dumps(ev("ADDED", pod(f"p{i}", i), str(10 + i))).encode() + b"\n" for i in range(3))
        for part in (lines[:7], lines[7:200], lines[200:]):  # events cut mid-line across chunks
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


def test_kubeapi_watch_reads_events_across_chunks_and_raises_410():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = KubeAPI(f"http://127.0.0.1:{server.server_address[1]}")
        events = list(api.watch("/api/v1/pods", {"resourceVersion": "9"}, 5))
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", f"p{i}") for i in range(3)]
        assert pod_use(events[2]["object"]).gpus == 2
        with pytest.raises(ApiError) as gone:
            list(api.watch("/api/v1/pods", {"resourceVersion": "1"}, 5))
        assert gone.value.status == 410
    finally:
        server.shutdown()


def test_rlkube_pod_events_of_the_inventory_wake_their_job_in_watched_namespaces_only():
    import asyncio

    from rlkube.operator.controller.handlers import follow_inventory_pods

    class Queue:
        requested: list = []

        def request(self, key):
            self.requested.append(key)

    async def main():
        store, queue = PodStore(), Queue()
        follow_inventory_pods(queue, store, ["team"])
        threads = [threading.Thread(target=store.apply, args=("ADDED", p)) for p in (
            pod("a-0", planned="n1"), pod("x-0", planned="n1", namespace="elsewhere"),
            pod("plain", node_name="n1", job_name=None))]
        for t in threads:
            t.start()
            t.join()
        await asyncio.sleep(0)  # the threads are done: their call_soon_threadsafe callbacks run now
        return queue.requested

    assert asyncio.run(main()) == [("team", "a")]


def test_job_events_of_the_inventory_wake_their_job_but_not_the_echo_of_our_own_status_write():
    import asyncio

    from rlkube.operator.controller.cluster_state import JobStore
    from rlkube.operator.controller.handlers import follow_inventory_jobs

    def body(name: str, version: str) -> dict:
        return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "resourceVersion": version,
                             "creationTimestamp": "2026-12-04T00:00:00Z", "generation": 1},
                "spec": {}, "status": {}}

    class Reconciler:
        cleaned: list = []

        def own_write(self, key, version):
            return (key, version) == (("team", "a"), "7")

        def clean_checkpoints(self, job):
            self.cleaned.append(job["metadata"]["name"])

    class Queue:
        def __init__(self):
            self.reconciler, self.requested, self.forgotten, self._tasks = Reconciler(), [], [], set()

        def request(self, key):
            self.requested.append(key)

        def forget(self, key):
            self.forgotten.append(key)

        async def off_loop(self, call, *args):
            call(*args)

    async def main():
        store, queue = JobStore(), Queue()
        store.replace([body("old", "1")])             # listed before the operator followed the store
        follow_inventory_jobs(queue, [store])
        for kind, obj in (("ADDED", body("a", "5")), ("MODIFIED", body("a", "7")),  # 7: our own write
                          ("MODIFIED", body("a", "8")), ("DELETED", body("b", "9"))):
            thread = threading.Thread(target=store.apply, args=(kind, obj))
            thread.start()
            thread.join()
        store.replace([body("a", "8")])               # a relist requests every job again
        for _ in range(3):
            await asyncio.sleep(0)
        return queue

    queue = asyncio.run(main())
    assert queue.requested == [("team", "old"), ("team", "a"), ("team", "a"), ("team", "a")]
    assert queue.forgotten == [("team", "b")] and queue.reconciler.cleaned == ["b"]


def test_planning_turns_go_to_the_oldest_waiting_job_one_at_a_time():
    from rlkube.operator.controller.cluster_state import PlanningTurns

    turns, order, inside = PlanningTurns(), [], []
    holding, release = threading.Event(), threading.Event()

    def first():
        with turns.turn(("2026-12-04T00:00:05Z", "first", "team")):
            holding.set()
            release.wait(5)
            order.append("first")

    def plan(created: str, name: str) -> None:
        with turns.turn((created, name, "team")):
            inside.append(name)
            assert len(inside) == 1  # nobody else plans meanwhile
            order.append(name)
            inside.remove(name)

    holder = threading.Thread(target=first)
    holder.start()
    holding.wait(5)
    waiters = [threading.Thread(target=plan, args=args) for args in (
        ("2026-12-04T00:00:09Z", "young"), ("2026-12-04T00:00:01Z", "old"), ("2026-12-04T00:00:03Z", "middle"))]
    for t in waiters:
        t.start()
    for _ in range(500):  # all three wait for their turn (a bounded wait, no sleep-for-luck)
        with turns._cond:
            if len(turns._queue) == 3:
                break
        threading.Event().wait(0.01)
    release.set()
    for t in (holder, *waiters):
        t.join(5)
    assert order == ["first", "old", "middle", "young"]


def test_checkpoint_cleanup_pods_of_the_inventory_are_handed_to_the_reconciler_not_when_deleted():
    import asyncio

    from rlkube.operator.controller.handlers import follow_inventory_pods
    from rlkube.operator.render.cleanup import LABEL_CLEANUP

    def cleanup_pod(name: str, namespace: str = "team") -> dict:
        return {"metadata": {"name": name, "namespace": namespace, "labels": {LABEL_CLEANUP: "a"}},
                "spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}}

    class Queue:
        def __init__(self):
            self.requested, self.removed, self._tasks = [], [], set()
            self.reconciler = self

        def request(self, key):
            self.requested.append(key)

        def remove_cleanup_pod(self, pod):
            self.removed.append(pod["metadata"]["name"])

        async def off_loop(self, call, *args):
            call(*args)

    async def main():
        store, queue = PodStore(), Queue()
        follow_inventory_pods(queue, store, ["team"])
        for kind, obj in (("MODIFIED", cleanup_pod("done")), ("DELETED", cleanup_pod("gone")),
                          ("MODIFIED", cleanup_pod("other", namespace="elsewhere"))):
            thread = threading.Thread(target=store.apply, args=(kind, obj))
            thread.start()
            thread.join()
        for _ in range(3):
            await asyncio.sleep(0)
        return queue

    queue = asyncio.run(main())
    assert queue.removed == ["done"] and queue.requested == []
