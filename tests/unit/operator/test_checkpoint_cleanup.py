"""hostPath checkpoint folders go with their job: the status remembers every node a plan used
(status.checkpointNodes), and the job's DELETED event makes one cleanup pod per such node."""

from __future__ import annotations

from operator_builders import UID, World, at, job, node

from rlkube.operator import lifecycle
from rlkube.operator.api.observed import JobRef, format_time
from rlkube.operator.render import checkpoint_host_path, cleanup

OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
FAST = lifecycle.Settings(unschedulable_retry_seconds=15, node_lost_grace_seconds=60)


def test_the_status_keeps_every_node_a_plan_used_across_attempts():
    w = World(job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 2}}), [node("a", 2), node("b", 2)], FAST)
    w.step(at(0))
    w.step(at(1))
    w.bind_all()
    w.step(at(2))
    (first,) = {p["node"] for p in w.status["placement"]["pods"]}
    assert w.status["checkpointNodes"] == [first]
    # The node is shut down (out-of-service): the next attempt runs on the other node, and the
    # first one is still listed, since its hostPath still holds the earlier checkpoints.
    lost = next(n for n in w.nodes if n["metadata"]["name"] == first)
    lost["spec"]["taints"] = [OUT_OF_SERVICE]
    for pod in w.pods.values():  # the taint eviction controller deletes the pods that do not tolerate it
        pod["metadata"]["deletionTimestamp"] = format_time(at(35))
    assert w.step(at(5)).action == "replan"
    for t in range(6, 10):
        w.step(at(t))
    assert w.status["attempt"] == 1 and w.status["placement"]["pods"][0]["node"] != first
    assert w.status["checkpointNodes"] == ["a", "b"]


def test_a_job_with_a_volume_claim_lists_no_nodes_and_gets_no_cleanup():
    w = World(job(algorithm="dpo", gpus_per_pod=2, roles={"actor": {"gpus": 2}},
                  checkpoint={"volumeClaim": "shared"}), [node("a", 2)], FAST)
    w.step(at(0))
    assert "checkpointNodes" not in w.status
    assert cleanup.cleanup_pods({**w.job, "spec": w.job["spec"]}) == []


def deleted(nodes: list[str]) -> dict:
    body = job(algorithm="dpo")
    body["status"] = {"checkpointNodes": nodes, "placement": {"pods": [{"index": 0, "node": "c"}]}}
    return body


def test_one_cleanup_pod_per_node_removes_exactly_the_jobs_folder():
    pods = cleanup.cleanup_pods(deleted(["a", "b"]))
    assert [p["spec"]["nodeName"] for p in pods] == ["a", "b", "c"]
    folder = checkpoint_host_path(JobRef("tiny", "team", UID))
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["command"][-1] == cleanup.MOUNT + folder.removeprefix("/var/lib/rlkube")
        assert pod["spec"]["volumes"][0]["hostPath"]["path"] == "/var/lib/rlkube"
        assert pod["metadata"]["labels"][cleanup.LABEL_CLEANUP] == "tiny"
        assert "ownerReferences" not in pod["metadata"]  # the job is gone
    assert len({p["metadata"]["name"] for p in pods}) == 3
    # Deterministic names: a repeated DELETED event meets AlreadyExists.
    assert [p["metadata"]["name"] for p in cleanup.cleanup_pods(deleted(["a", "b"]))] == \
        [p["metadata"]["name"] for p in pods]


def test_a_shared_host_path_needs_one_cleanup_pod():
    assert len(cleanup.cleanup_pods(deleted(["a", "b"]), host_path_shared=True)) == 1


def test_the_script_removes_the_folder_and_an_empty_namespace_folder(tmp_path):
    import subprocess
    import sys
    ns = tmp_path / "team"
    target = ns / f"tiny-{UID}"
    (target / "step-000000010").mkdir(parents=True)
    (target / "step-000000010" / "x").write_text("x")
    pod = cleanup.cleanup_pods(deleted(["a"]))[0]
    script = pod["spec"]["containers"][0]["command"][2]
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True)
    assert done.returncode == 0 and not target.exists() and not ns.exists(), done.stdout


def test_only_ended_cleanup_pods_are_removed():
    assert cleanup.finished({"status": {"phase": "Succeeded"}}) == "Succeeded"
    assert cleanup.finished({"status": {"phase": "Failed"}}) == "Failed"
    assert cleanup.finished({"status": {"phase": "Running"}}) is None
