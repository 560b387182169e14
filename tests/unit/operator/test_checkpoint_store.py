"""Checkpoints a gang that spans nodes can resume from: without `checkpoint.volumeClaim` each node
keeps its own hostPath, which the other nodes do not see, so such a job is planned on one node
only, and refused with a reason naming the field when it fits only across nodes. An operator told
that the hostPath root is one shared filesystem (--host-path-shared) plans across nodes."""

from __future__ import annotations

import pytest
from operator_builders import World, at, job, node

from rlkube.operator import lifecycle

SHARED = lifecycle.Settings(unschedulable_retry_seconds=15, host_path_shared=True)
PER_NODE = lifecycle.Settings(unschedulable_retry_seconds=15)


def nodes_of(w: World) -> set[str]:
    return {p["node"] for p in w.status["placement"]["pods"]}


def four_gpu_job(**spec) -> dict:
    return job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 4}}, **spec)


def test_a_job_that_fits_only_across_nodes_without_a_claim_is_refused_naming_the_field():
    w = World(four_gpu_job(), [node("a", 2), node("b", 2)], PER_NODE)
    d = w.step(at(0))
    assert d.action == "unschedulable" and not d.create
    assert w.status["phase"] == "Pending"
    message = w.events[-1].message
    assert w.events[-1].reason == "Unschedulable"
    assert "across 2 nodes (a, b)" in message and "spec.checkpoint.volumeClaim is not set" in message, message


@pytest.mark.parametrize(("spec", "settings"), [
    ({"checkpoint": {"volumeClaim": "shared-ckpt"}}, PER_NODE),  # a claim every node mounts
    ({}, SHARED),                                                 # the operator says hostPath is shared
])
def test_a_shared_store_lets_the_gang_span_nodes(spec, settings):
    w = World(four_gpu_job(**spec), [node("a", 2), node("b", 2)], settings)
    w.step(at(0))
    assert nodes_of(w) == {"a", "b"}


def test_a_gang_that_fits_one_node_is_placed_there_without_a_claim():
    w = World(four_gpu_job(), [node("a", 2), node("b", 4)], PER_NODE)
    w.step(at(0))
    assert nodes_of(w) == {"b"} and len(w.status["placement"]["pods"]) == 2


def test_an_elastic_job_without_a_claim_runs_at_the_largest_size_one_node_holds():
    w = World(four_gpu_job(elastic={"minWorkers": 1, "maxWorkers": 2}), [node("a", 2), node("b", 2)], PER_NODE)
    w.step(at(0))
    assert len(w.status["placement"]["pods"]) == 1 and len(nodes_of(w)) == 1
    assert w.status["gpus"] == 2
