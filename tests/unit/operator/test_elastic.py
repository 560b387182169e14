"""Elastic gang size: a job with `spec.elastic` is planned at the largest pod count in
[minWorkers, maxWorkers] that the free GPUs fit, and a job running below maxWorkers is restarted
larger (not counted as a failure) once a larger gang fits."""

from __future__ import annotations

import copy

import yaml
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle, render
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.planning.cluster import cluster_view

# These gangs span the two nodes: their hostPath checkpoints are declared shared (the one-node
# rule without a shared store is tested in test_checkpoint_store.py).
FAST = lifecycle.Settings(backoff_base_seconds=10, backoff_max_seconds=40, unschedulable_retry_seconds=15,
                          host_path_shared=True)


def blocker(node_name: str, gpus: int) -> dict:
    """Another workload's bound pod holding `gpus` GPUs of a node."""
    return {"metadata": {"name": f"other-{node_name}", "namespace": "others", "uid": "other"},
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}


def elastic_world(actor_gpus: int = 4, min_workers: int = 1, max_workers: int = 2, blocked: dict | None = None) -> World:
    """A DPO job of pods of 2 GPUs on two nodes of 2 GPUs; `blocked`: node -> GPUs others hold."""
    w = World(job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": actor_gpus}},
                  elastic={"minWorkers": min_workers, "maxWorkers": max_workers}),
              [node("a", 2), node("b", 2)], FAST)
    w.other_pods = [blocker(n, g) for n, g in (blocked or {}).items()]
    return w


def run(w: World, t0: float) -> None:
    """Plan, admit, bind and reach Running from time t0."""
    w.step(at(t0))
    w.step(at(t0 + 1))
    w.bind_all()
    w.step(at(t0 + 2))
    assert w.status["phase"] == "Running", w.status


def env_of(pod: dict) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_a_full_node_shrinks_the_gang_and_everything_follows_the_plan():
    w = elastic_world(blocked={"b": 2})
    d = w.step(at(0))
    pods = [o for o in d.create if o["kind"] == "Pod"]
    assert len(pods) == 1 and pods[0]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert env_of(pods[0])["WORLD_SIZE"] == "2"
    (configmap,) = [o for o in d.create if o["kind"] == "ConfigMap"]
    run_config = yaml.safe_load(configmap["data"][render.CONFIG_FILE])
    assert run_config["roles"]["actor"]["gpus"] == 2 and run_config["deviceMap"]["actor"] == [0, 1]
    assert w.status["gpus"] == 2 and len(w.status["placement"]["pods"]) == 1
    placed = next(e for e in w.events if e.reason == "Placed")
    assert "elastic: 1 pods of minWorkers 1..maxWorkers 2" in placed.message


def test_freed_gpus_grow_the_running_gang_without_counting_a_restart():
    w = elastic_world(blocked={"b": 2})
    run(w, 0)
    d = w.step(at(5))
    assert not d.delete and w.status["phase"] == "Running"  # no room yet: keeps running at 1 pod

    w.other_pods = []  # the other workload finished
    d = w.step(at(10))
    assert d.action == "replan" and len(d.delete) == 1
    assert w.status["phase"] == "Restarting" and w.status["restarts"] == 0 and w.status["attempt"] == 1
    grow = next(e for e in w.events if e.reason == "ElasticGrow")
    assert "2 pods fit now, running with 1" in grow.message

    d = w.step(at(11))  # the old pod is gone: plan again, now at the full size
    pods = [o for o in d.create if o["kind"] == "Pod"]
    assert len(pods) == 2 and {env_of(p)["WORLD_SIZE"] for p in pods} == {"4"}
    assert w.status["gpus"] == 4


def test_the_larger_gang_is_planned_even_when_the_node_listing_still_has_the_old_pod():
    """The reconciler's node-wide pod listing is cached for seconds; the attempt planned right
    after the grow teardown must not count the just-deleted pod of the smaller gang as holding its
    GPUs (CI saw three ElasticGrow restarts in a row, each planning one pod on the other node)."""
    w = elastic_world(blocked={"a": 2})
    run(w, 0)
    (old_pod,) = w.pods.values()
    assert old_pod["spec"]["nodeName"] == "b"
    w.other_pods = []
    w.listing = w.bound()  # taken now: the old pod on b is in it, and stays while the cache lives
    d = w.step(at(10))
    assert d.action == "replan" and not w.pods

    d = w.step(at(11))
    pods = [o for o in d.create if o["kind"] == "Pod"]
    assert len(pods) == 2 and w.status["gpus"] == 4, w.status


def test_at_max_workers_nothing_is_checked_or_changed():
    w = elastic_world()
    run(w, 0)
    assert len(w.status["placement"]["pods"]) == 2
    writes = w.writes
    for t in (5, 6, 7):
        d = w.step(at(t))
        assert not d.delete and not d.create and not d.events
    assert w.writes == writes


def test_below_min_workers_stays_pending_and_says_so():
    w = elastic_world(min_workers=2, blocked={"b": 1})
    w.step(at(0))
    assert w.status["phase"] == "Pending" and not w.pods
    assert w.reasons() == ["Unschedulable"]
    (event,) = w.events
    assert event.message.startswith("elastic: not even minWorkers 2 pods fit: needs 4 GPUs in 2 pods of 2")


def test_max_workers_above_the_roles_gpus_plans_the_larger_gang_at_once():
    w = elastic_world(actor_gpus=2, max_workers=2)
    d = w.step(at(0))
    pods = [o for o in d.create if o["kind"] == "Pod"]
    assert len(pods) == 2 and {env_of(p)["WORLD_SIZE"] for p in pods} == {"4"}
    assert len(w.status["placement"]["pods"]) == 2


def test_a_job_without_elastic_never_resizes():
    w = World(job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 4}}), [node("a", 2), node("b", 2)], FAST)
    w.other_pods = [blocker("b", 2)]
    w.step(at(0))
    assert w.status["phase"] == "Pending" and not w.pods
    assert "needs 4 GPUs in 2 pods of 2" in w.events[0].message


def test_own_gpus_come_from_the_same_listing_as_the_inventory():
    """A listing taken before the job's pods bound does not count them; the GPUs "freed" by the
    job must not then be subtracted a second time from another workload's."""
    w = elastic_world()
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    own = [p for p in w.pods.values() if p["spec"].get("nodeName") == "a"]
    spec = w.view().spec
    other = blocker("a", 1)
    fresh = cluster_view([node("a", 4)], [*own, other], spec, own_uid=w.view().ref.uid)
    assert fresh.inventory[0].gpus_used == 3 and fresh.own_gpus == {"a": 2}
    stale = cluster_view([node("a", 4)], [other], spec, own_uid=w.view().ref.uid)
    assert stale.inventory[0].gpus_used == 1 and stale.own_gpus == {}


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch, as the API server applies the reconciler's status patches."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


class ListingAPI:
    """The few KubeAPI calls a reconcile of a Running job makes, over a World's objects; the
    node-wide pod listing is `self.bound` (what the API server would return now)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.bound = w.bound()
        self.listings = 0
        self.deleted: list[str] = []
        self.created: list[str] = []

    def get_job(self, namespace, name):
        return copy.deepcopy(self.w.job)

    def list_pods(self, namespace, label_selector):
        return copy.deepcopy(list(self.w.pods.values()))

    def list_nodes(self):
        self.listings += 1
        return copy.deepcopy(self.w.nodes)

    def list_bound_pods(self):
        return copy.deepcopy(self.bound)

    def list_planned_pods(self):
        return []

    def list_jobs(self, namespace):
        return [copy.deepcopy(self.w.job)]

    def patch_job_status(self, namespace, name, resource_version, patch):
        self.w.job["status"] = merge_patch(self.w.status, patch)

    def create(self, obj):
        self.created.append(obj["metadata"]["name"])
        return True

    def delete_pod(self, namespace, name, uid=None):
        self.deleted.append(name)

    def post_event(self, involved, type_, reason, message, **kw):
        self.w.events.append(lifecycle.Event(type_, reason, message))


def running_small_job() -> tuple[World, ListingAPI, Reconciler]:
    w = elastic_world(blocked={"a": 2})
    run(w, 0)
    api = ListingAPI(w)
    return w, api, Reconciler(api, FAST, progress=lambda ip, port: None)


def test_a_grow_is_confirmed_on_a_fresh_listing_before_the_gang_is_restarted():
    """The cached listing says node a is free, but another workload's pod bound there since:
    restarting the gang would only plan it small again, so it keeps running."""
    w, api, reconciler = running_small_job()
    api.bound = [p for p in api.bound if p["metadata"]["namespace"] != "others"]
    reconciler.inventory.snapshot("team")  # cached: node a looks free
    api.bound = w.bound()       # the API server now: a is held again
    decision = reconciler.reconcile("team", "tiny")
    assert decision.action != "replan" and not api.deleted and w.status["phase"] == "Running", decision
    assert api.listings == 2 and "ElasticGrow" not in w.reasons()


def test_a_grow_that_a_fresh_listing_confirms_goes_ahead():
    w, api, reconciler = running_small_job()
    w.other_pods = []
    api.bound = w.bound()
    reconciler.inventory.snapshot("team")
    decision = reconciler.reconcile("team", "tiny")
    assert decision.action == "replan" and len(api.deleted) == 1 and w.status["phase"] == "Restarting"
    assert api.listings == 2 and "ElasticGrow" in w.reasons()
