"""A job's environment (roles.environment) on a real cluster, with the reference image
(images/environment): a Deployment, a headless Service and a NetworkPolicy owned by the job, scaled
with its spec, removed with it, and a GRPO job that scores through it to Succeeded while one of its replicas is
killed.

The kill is a SIGKILL of a replica's container through its node's containerd (a crash, as
test_resilience does to a trainer). The trainers' client retries the calls that land on it and
the job goes on: no gang restart, no completion left without a reward. Because a crash leaves a
window of a second or two in which calls can land on the dead replica, and a step spends only
part of its time scoring, the kill alone does not always cost a call; the environment also
answers every FAIL_EVERY-th call with 503, so the step records always show retries, and the test
checks that every retried call still ended in a reward (envFailures 0).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e import deploy
from tests.e2e.test_resilience import kill_training_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ENVIRONMENT_IMAGE = "environment"
STEPS = 60
FAIL_EVERY = 6


@pytest.fixture(scope="module")
def environment_image(deployed):
    return deploy.build_and_load(deployed.cluster, ENVIRONMENT_IMAGE)


def environment_job(deployed, image: str, prefix: str, **spec) -> tuple[str, dict]:
    name = deployed.job_name(prefix)
    job = deploy.job_manifest(name, deployed.jobs_namespace, "grpo-environment-cpu.yaml",
                              training={"steps": STEPS}, checkpoint={"everySteps": STEPS}, **spec)
    environment = job["spec"]["roles"]["environment"]
    environment.update(image=image, replicas=2)
    environment["env"] = [*environment.get("env", []), {"name": "FAIL_EVERY", "value": str(FAIL_EVERY)}]
    return name, job


def environment_pods(cluster, ns: str, name: str) -> list[dict]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", f"rlkube.io/environment={name}", "-o", "json")
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def environment_objects(cluster, ns: str, name: str) -> list[str]:
    """The kinds of the job's environment objects that still exist."""
    found = []
    for kind in ("deployment", "service", "networkpolicy"):
        if cluster.kubectl("get", kind, f"{name}-environment", "-n", ns, "--ignore-not-found", "-o", "name").strip():
            found.append(kind)
    return found


def step_records(cluster, ns: str, name: str) -> list[dict]:
    pod = deploy.rank0_pod(cluster, ns, name)["metadata"]["name"]
    lines = cluster.kubectl("logs", "-n", ns, pod, "--all-containers").splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in records if r.get("event") == "step"]


def test_environment_is_owned_scaled_and_removed_with_its_job(deployed, environment_image):
    """While the job is suspended (no trainer runs) its environment still starts: scaled by a patch
    of replicas, refused a change of image, and gone with the job."""
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = environment_job(deployed, environment_image, "envown", runPolicy={"suspend": True})
    deploy.apply(cluster, job)
    try:
        deploy.wait_job(cluster, ns, name, lambda j: (j.get("status", {}).get("environment") or {})
                        .get("readyReplicas") == 2, "2 environment replicas ready", timeout=300)
        assert environment_objects(cluster, ns, name) == ["deployment", "service", "networkpolicy"]
        for kind in ("deployment", "networkpolicy"):
            obj = json.loads(cluster.kubectl("get", kind, f"{name}-environment", "-n", ns, "-o", "json"))
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == ("RLTrainingJob", name), kind
        # Whether the cluster's network plugin enforces it is the plugin's business; its rules are ours.
        policy = obj["spec"]
        assert policy["podSelector"] == {"matchLabels": {"rlkube.io/environment": name}}
        assert policy["policyTypes"] == ["Ingress", "Egress"] and not policy.get("egress")
        assert policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {"rlkube.io/job": name}}}]

        cluster.kubectl("patch", "rltj", name, "-n", ns, "--type", "merge",
                        "-p", json.dumps({"spec": {"roles": {"environment": {"replicas": 3}}}}))
        done = deploy.wait_job(cluster, ns, name, lambda j: (j.get("status", {}).get("environment") or {})
                               .get("readyReplicas") == 3, "3 environment replicas ready", timeout=300)
        assert done["status"]["environment"]["replicas"] == 3
        assert len(environment_pods(cluster, ns, name)) == 3

        with pytest.raises(RuntimeError, match="roles.environment.image is immutable"):
            cluster.kubectl("patch", "rltj", name, "-n", ns, "--type", "merge",
                            "-p", json.dumps({"spec": {"roles": {"environment": {"image": "other:dev"}}}}))
    finally:
        deploy.delete_job(cluster, ns, name)
    deploy.wait_until(f"the environment of deleted job {name} to be gone",
                      lambda: not environment_objects(cluster, ns, name) and not environment_pods(cluster, ns, name),
                      180, interval=2.0)


def test_grpo_scores_through_its_environment_and_survives_a_killed_replica(deployed, environment_image):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name, job = environment_job(deployed, environment_image, "envgrpo")
    deploy.apply(cluster, job)
    try:
        running = deploy.wait_job(cluster, ns, name, lambda j: deploy.step(j) >= 1
                                  and (j["status"].get("environment") or {}).get("readyReplicas") == 2,
                                  "step >= 1 with 2 environment replicas ready", timeout=600)
        assert deploy.step(running) < STEPS, "the run ended before a replica could be killed mid-run"
        victim = next(p for p in environment_pods(cluster, ns, name) if ready(p))
        kill_training_process(cluster, victim)
        deploy.log(f"killed environment replica {victim['metadata']['name']} at step {deploy.step(running)}")

        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=1200)
        assert done["status"]["progress"]["step"] == STEPS
        assert done["status"]["restarts"] == 0  # the crash cost retries, not the gang
        restarted = json.loads(cluster.kubectl("get", "pod", victim["metadata"]["name"], "-n", ns, "-o", "json"))
        assert restarted["status"]["containerStatuses"][0]["restartCount"] >= 1  # the kill did happen

        records = step_records(cluster, ns, name)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        retries = sum(r["envRetries"] for r in records)
        failures = sum(r["envFailures"] for r in records)
        deploy.log(f"{name}: {retries} retried calls, {failures} completions without a reward over {STEPS} steps")
        assert retries >= 1 and failures == 0, (retries, failures)
        assert all(r["envCallsPerSecond"] > 0 and 0.0 <= r["rewardMean"] <= 1.0 for r in records)
        # Finished: the environment holds no replicas any more, but stays until the job goes.
        deploy.wait_job(cluster, ns, name, lambda j: j["status"]["environment"]["replicas"] == 0,
                        "the environment scaled to 0", timeout=120)
    finally:
        deploy.delete_job(cluster, ns, name)
    deploy.wait_until(f"the environment of deleted job {name} to be gone",
                      lambda: not environment_objects(cluster, ns, name), 180, interval=2.0)
