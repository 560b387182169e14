"""An elastic job on the real cluster: started smaller because another workload holds one node's
GPUs, then grown to its full size from its checkpoint once those GPUs are free.

The harness's nodes share this machine's filesystem, so the hostPath checkpoint directory is one
directory for every pod; on a real cluster an elastic job that spans nodes needs a shared
`checkpoint.volumeClaim`.
"""

from __future__ import annotations

import pytest

from tests.e2e import deploy
from tests.e2e.deploy import EVERY, LONG_STEPS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def gpu_holder(namespace: str, node: str, gpus: int, image: str) -> dict:
    """Another workload: a pod that holds `gpus` (fake) GPUs of `node` and sleeps."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gpu-holder-{node}", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sleep",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi", "nvidia.com/gpu": str(gpus)},
                              "limits": {"memory": "16Mi", "nvidia.com/gpu": str(gpus)}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


def placed_pods(job: dict) -> int:
    return len(((job.get("status") or {}).get("placement") or {}).get("pods") or [])


def test_elastic_job_starts_small_then_grows_from_its_checkpoint(deployed):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    busy = cluster.nodes[-1].name
    holder = gpu_holder(ns, busy, 2, deployed.runtime_image)
    deploy.apply(cluster, holder)
    holder_name = holder["metadata"]["name"]
    name, job = deploy.long_job(deployed, "elastic", roles={"actor": {"gpus": 4}}, placement={"gpusPerPod": 2},
                                elastic={"minWorkers": 1, "maxWorkers": 2})
    try:
        cluster.kubectl("wait", "--for=jsonpath={.status.phase}=Running", f"pod/{holder_name}", "-n", ns,
                        "--timeout=120s", timeout=150)
        deploy.apply(cluster, job)

        # Two pods of 2 do not fit while one node is held: it runs as one pod (world size 2).
        small = deploy.wait_job(cluster, ns, name, lambda j: deploy.phase(j) == "Running" and deploy.step(j) >= EVERY // 2,
                                f"Running at step >= {EVERY // 2}", timeout=420)
        assert placed_pods(small) == 1 and small["status"]["gpus"] == 2, small["status"]
        assert {p["spec"]["nodeName"] for p in deploy.job_pods(cluster, ns, name)} != {busy}

        # The other workload ends: the gang is restarted at its full size, not counted as a failure.
        cluster.kubectl("delete", "pod", holder_name, "-n", ns, "--wait=true", timeout=120)
        at_grow = deploy.step(deploy.get_job(cluster, ns, name))
        grown = deploy.wait_job(cluster, ns, name, lambda j: placed_pods(j) == 2 and deploy.phase(j) == "Running",
                                "Running as 2 pods", timeout=300)
        assert grown["status"]["attempt"] == 1 and grown["status"]["restarts"] == 0, grown["status"]
        pods = deploy.job_pods(cluster, ns, name)
        worlds = {e["value"] for p in pods for e in p["spec"]["containers"][0]["env"] if e["name"] == "WORLD_SIZE"}
        assert len(pods) == 2 and worlds == {"4"}, (len(pods), worlds)

        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        assert done["status"]["progress"]["step"] == LONG_STEPS and done["status"]["gpus"] == 4
        # SIGTERM made the small gang checkpoint on its way out: the large one resumed there.
        resumed = deploy.resumed_step(cluster, ns, name)
        assert resumed is not None and resumed >= at_grow > 0, (resumed, at_grow)
        reasons = [e["reason"] for e in deploy.events(cluster, ns, name)]
        assert reasons.count("Placed") == 2 and "ElasticGrow" in reasons, reasons
        assert reasons.index("ElasticGrow") < max(i for i, r in enumerate(reasons) if r == "Placed"), reasons
    finally:
        cluster.kubectl("delete", "pod", holder_name, "-n", ns, "--ignore-not-found", "--wait=false")
        deploy.delete_job(cluster, ns, name)
