"""A job deleted while no operator runs still has its hostPath checkpoint folder removed: the
operator that starts later finds the job's checkpoint record without its job and cleans
(operator/.../cleanup.py, checkpoint_sweep.py; docs/scheduling.md, "Retention of hostPath
checkpoints"). The chaos soak found the case: the operator exits when an API-server outage
outlasts its Lease, and a job deleted meanwhile kept its folder for ever.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e import deploy
from tests.e2e.deploy import EVERY, HOST_CHECKPOINTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

SWEEP_BOUND_S = 120  # from `kubectl scale --replicas=1` to the folder gone: pod start + first sweep


def _scale_operator(cluster, replicas: int) -> None:
    cluster.kubectl("scale", "deployment", deploy.RELEASE, "-n", deploy.OPERATOR_NAMESPACE, f"--replicas={replicas}")


def test_a_job_deleted_while_no_operator_runs_is_cleaned_when_one_starts(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = deploy.long_job(deployed, "sweep")
    deploy.apply(cluster, job)
    stopped = False
    try:
        running = deploy.wait_job(cluster, ns, name, lambda j: deploy.step(j) >= EVERY, f"step >= {EVERY}", timeout=420)
        uid = running["metadata"]["uid"]
        folder = HOST_CHECKPOINTS / ns / f"{name}-{uid}"
        deploy.wait_until(f"a committed checkpoint in {folder}",
                          lambda: any(folder.glob("step-*/rlkube-checkpoint.json")), 120)
        record = f"{name}-ckpt-{uid[:8]}"
        data = json.loads(cluster.kubectl("get", "configmap", record, "-n", ns, "-o", "json"))["data"]
        assert data["uid"] == uid and data["nodes"].split("\n") == running["status"]["checkpointNodes"]

        _scale_operator(cluster, 0)
        stopped = True
        deploy.wait_until("no operator pod", lambda: not deploy.operator_pods(cluster), 120)
        cluster.kubectl("delete", "rltj", name, "-n", ns, "--wait=true", timeout=120)  # no finalizer holds it
        deploy.wait_until(f"the pods of {name} collected", lambda: not deploy.job_pods(cluster, ns, name), 120)
        time.sleep(5)  # a moment for anything else that might remove it; nothing should
        assert folder.exists(), "nothing runs that could remove the folder while the operator is stopped"

        started = time.monotonic()
        _scale_operator(cluster, 1)
        stopped = False
        deploy.wait_until(f"the folder {folder} removed by the operator that started", lambda: not folder.exists(),
                          SWEEP_BOUND_S, interval=1.0)
        took = time.monotonic() - started
        deploy.log(f"sweep: folder of {name} removed {took:.1f} s after the operator was scaled back to 1")
        deploy.wait_until(f"the checkpoint record {record} deleted", lambda: not cluster.kubectl(
            "get", "configmap", record, "-n", ns, "--ignore-not-found", "-o", "name").strip(), 60)
        selector = f"rlkube.io/checkpoint-cleanup={name}"
        deploy.wait_until(f"the cleanup pods of {name} deleted", lambda: not json.loads(cluster.kubectl(
            "get", "pods", "-n", ns, "-l", selector, "-o", "json"))["items"], 60, interval=2.0)
    finally:
        if stopped:
            _scale_operator(cluster, 1)
        deploy.wait_operator_ready(cluster, timeout=300)
        deploy.delete_job(cluster, ns, name)  # when the test failed before its own deletion
