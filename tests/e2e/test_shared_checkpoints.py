"""A gang spanning both nodes keeps its checkpoints on a shared volume (checkpoint.volumeClaim):
its pods deleted mid-run, the job restarts and resumes from its last step, not step 0, and the
committed checkpoint holds every rank's shards under one commit marker.

The volume is a ReadWriteMany PersistentVolume of type hostPath: the harness's nodes share this
machine's disk, so it is one filesystem for both kubelets, as an NFS volume is on a real cluster.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e import deploy
from tests.e2e.deploy import EVERY, LONG_STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

PV_ROOT = Path("/var/lib/rlkube-e2e-pv")


def shared_volume(name: str, namespace: str, path: Path) -> list[dict]:
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                   "claimRef": {"namespace": namespace, "name": name},
                   "hostPath": {"path": str(path), "type": "Directory"}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": name,
                    "resources": {"requests": {"storage": "1Gi"}}}}
    return [pv, pvc]  # fmt: skip


def test_a_two_node_job_killed_resumes_from_its_last_step_on_a_shared_volume(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = deploy.long_job(deployed, "shared", roles={"actor": {"gpus": 4}}, placement={"gpusPerPod": 2})
    path = PV_ROOT / name
    path.mkdir(parents=True)
    path.chmod(0o777)  # a hostPath volume keeps its owner: the non-root trainer must write here
    job["spec"]["checkpoint"]["volumeClaim"] = name
    pv, pvc = shared_volume(name, ns, path)
    for obj in (pv, pvc):
        deploy.apply(cluster, obj)
    try:
        deploy.apply(cluster, job)
        running = deploy.wait_job(cluster, ns, name, lambda j: deploy.phase(j) == "Running" and deploy.step(j) >= EVERY + 5,
                                  f"Running at step >= {EVERY + 5}", timeout=420)
        assert {p["node"] for p in running["status"]["placement"]["pods"]} == {n.name for n in cluster.nodes}
        at_kill = deploy.step(running)
        old = deploy.FollowedLogs(cluster, ns, [p["metadata"]["name"] for p in deploy.job_pods(cluster, ns, name)])
        cluster.kubectl("delete", "pods", "-n", ns, "-l", f"rlkube.io/job={name}", "--wait=false")

        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        old.stop()
        assert done["status"]["attempt"] >= 1 and done["status"]["progress"]["step"] == LONG_STEPS
        resumed = deploy.resumed_step(cluster, ns, name)
        # Deleted pods get SIGTERM, on which the trainer commits a checkpoint before it exits.
        assert resumed is not None and resumed >= at_kill, (
            f"resumed at {resumed}, killed at step {at_kill}; the killed attempt's pods said:\n{old.tail()}")

        # One commit marker over both ranks' shards (rank 0 on one node, rank 2 on the other).
        newest = max(path.glob("step-*/rlkube-checkpoint.json"))
        meta = json.loads(newest.read_text())
        assert meta["step"] == LONG_STEPS and meta["worldSize"] == 4, meta
        # DCP names a rank's files __<rank>_<n>.distcp (up to WRITE_THREADS files per rank)
        shards = sorted(p.name for p in newest.parent.glob("*.distcp"))
        assert {name.split("_")[2] for name in shards} == {"0", "1", "2", "3"}, shards
        assert not list(Path("/var/lib/rlkube", ns).glob(f"{name}-*")), "a hostPath folder was made despite the claim"
    finally:
        deploy.delete_job(cluster, ns, name)
        cluster.kubectl("delete", "pvc", name, "-n", ns, "--ignore-not-found", "--wait=true", timeout=120)
        cluster.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=true", timeout=120)
        shutil.rmtree(path, ignore_errors=True)
