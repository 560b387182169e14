"""Training survives what happens to real clusters: a training pod killed mid-run, a suspend and
resume, and an upgrade of the operator itself while jobs run.

Runs are longer than the demo's (LONG_STEPS) so there is time to act mid-training, and they
checkpoint often (EVERY) so a restart has a checkpoint to resume from. "Resumed from its
checkpoint" is read from the trainer's own log line in the new attempt's rank-0 pod, and the job
must still finish every step.
"""

from __future__ import annotations

import json

import pytest

from tests.cluster import kind
from tests.cluster import nodes as cluster_nodes
from tests.cluster.cluster import backend
from tests.e2e import deploy
from tests.e2e.deploy import EVERY, LONG_STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

def kill_training_process(cluster, pod: dict) -> None:
    """SIGKILL the trainer's container through its node's containerd: a crash, not a graceful stop."""
    (node,) = [n for n in cluster.nodes if n.name == pod["spec"]["nodeName"]]
    (status,) = [s for s in pod["status"]["containerStatuses"] if s.get("state", {}).get("running")]
    container_id = status["containerID"].split("://", 1)[1]
    if backend(cluster.layout) == "kind":  # the node is a container: its containerd is reached inside it
        kind.node_exec(cluster.layout, node.name, "ctr", "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL",
                       container_id)  # fmt: skip
        return
    cluster_nodes.ctr(cluster.layout, node, "tasks", "kill", "--signal", "SIGKILL", container_id)


def test_killed_pod_restarts_the_gang_from_its_checkpoint_and_completes(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = deploy.long_job(deployed, "kill")
    deploy.apply(cluster, job)
    try:
        running = deploy.wait_job(cluster, ns, name, lambda j: deploy.step(j) >= EVERY + 5,
                                  f"step >= {EVERY + 5}", timeout=420)
        at_kill = deploy.step(running)
        victim = [p for p in deploy.job_pods(cluster, ns, name) if p["metadata"]["labels"]["rlkube.io/pod-index"] == "1"]
        kill_training_process(cluster, victim[0])

        restarted = deploy.wait_job(cluster, ns, name, lambda j: j["status"].get("restarts", 0) >= 1,
                                    "a gang restart", timeout=180)
        assert restarted["status"]["restarts"] == 1
        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        assert done["status"]["progress"]["step"] == LONG_STEPS
        assert done["status"]["restarts"] == 1

        resumed = deploy.resumed_step(cluster, ns, name)
        assert resumed is not None, "the restarted attempt did not resume from a checkpoint"
        # The last checkpoint committed before the kill: a multiple of EVERY, at most the step seen.
        assert resumed % EVERY == 0 and EVERY <= resumed <= at_kill + EVERY, (resumed, at_kill)

        reasons = [e["reason"] for e in deploy.events(cluster, ns, name)]
        assert reasons.count("Placed") >= 2, reasons  # the second attempt was planned again
    finally:
        deploy.delete_job(cluster, ns, name)


def _patch_suspend(cluster, ns: str, name: str, value: bool) -> None:
    cluster.kubectl("patch", "rltj", name, "-n", ns, "--type=merge",
                    "-p", json.dumps({"spec": {"runPolicy": {"suspend": value}}}))


def test_suspend_stops_the_pods_and_resume_continues_from_the_checkpoint(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = deploy.long_job(deployed, "suspend")
    deploy.apply(cluster, job)
    try:
        deploy.wait_job(cluster, ns, name, lambda j: deploy.step(j) >= EVERY // 2, f"step >= {EVERY // 2}",
                        timeout=420)
        _patch_suspend(cluster, ns, name, True)
        suspended = deploy.wait_phase(cluster, ns, name, "Suspended", timeout=120)
        deploy.wait_until("the suspended job's pods to be gone", lambda: not deploy.job_pods(cluster, ns, name), 120)
        at_suspend = deploy.step(suspended)

        _patch_suspend(cluster, ns, name, False)
        deploy.wait_job(cluster, ns, name, lambda j: deploy.phase(j) == "Running", "Running again", timeout=300)
        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        assert done["status"]["progress"]["step"] == LONG_STEPS

        # SIGTERM makes the trainer checkpoint before it exits, so the resume is at or after the
        # last step the status showed while suspending.
        resumed = deploy.resumed_step(cluster, ns, name)
        assert resumed is not None and resumed >= at_suspend > 0, (resumed, at_suspend)
        reasons = [e["reason"] for e in deploy.events(cluster, ns, name)]
        assert "Suspended" in reasons and "Resumed" in reasons, reasons
        assert reasons.index("Suspended") < reasons.index("Resumed")
    finally:
        deploy.delete_job(cluster, ns, name)


def test_helm_upgrade_while_a_job_runs_does_not_restart_training_pods(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = deploy.long_job(deployed, "upgrade")
    deploy.apply(cluster, job)
    try:
        deploy.wait_job(cluster, ns, name, lambda j: deploy.step(j) >= 5, "step >= 5", timeout=420)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deploy.job_pods(cluster, ns, name)}
        old_operator = deploy.wait_operator_ready(cluster)["metadata"]["uid"]

        # A values change that rolls the operator's pod (its log level is an argument).
        deploy.install(cluster, values=deploy.local_values(logLevel="debug"))
        new_operator = deploy.wait_operator_ready(cluster)
        assert new_operator["metadata"]["uid"] != old_operator
        assert "--log-level=debug" in new_operator["spec"]["containers"][0]["args"]

        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in deploy.job_pods(cluster, ns, name)}
        assert after == before, "training pods were replaced by the operator upgrade"
        for pod in deploy.job_pods(cluster, ns, name):
            assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
        assert done["status"]["restarts"] == 0
        assert done["status"]["progress"]["step"] == LONG_STEPS
    finally:
        deploy.delete_job(cluster, ns, name)
        deploy.install(cluster)  # back to the session's values
