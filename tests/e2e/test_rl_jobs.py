"""The tiny GRPO and PPO examples, applied with kubectl, run by the CPU runtime image to Succeeded.

GRPO: the actor on two pods (world size 2; the reference shares the actor's group, the reward is
a function). PPO: the actor and the critic each on a pod of their own (the device map puts them
on different ranks), the reward a function. Shorter than the examples (STEPS) to keep CI time
down; what is checked is what a user reads: the phase, the step, the reward on /progress.
"""

from __future__ import annotations

import pytest

from tests.e2e import deploy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

STEPS = 6


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_tiny_rl_example_trains_to_succeeded(deployed, algorithm):
    cluster, ns = deployed.cluster, deployed.jobs_namespace
    name = deployed.job_name(algorithm)
    job = deploy.job_manifest(name, ns, f"{algorithm}-tiny-cpu.yaml",
                              training={"steps": STEPS}, checkpoint={"everySteps": 3})
    deploy.apply(cluster, job)
    try:
        done = deploy.wait_phase(cluster, ns, name, "Succeeded", timeout=600)
        progress = done["status"]["progress"]
        assert progress["step"] == STEPS, progress
        assert progress["tokensPerSecond"] > 0, progress
        assert 0.0 <= progress["rewardMean"] <= 1.0, progress  # target_pattern scores in [0, 1]
        pods = deploy.job_pods(cluster, ns, name)
        assert len(pods) == 2 and all(p["status"]["phase"] == "Succeeded" for p in pods), \
            [(p["metadata"]["name"], p["status"]["phase"]) for p in pods]
        assert done["status"]["restarts"] == 0
        roles = [set(p["metadata"]["annotations"]["rlkube.io/roles"].split(",")) for p in pods]
        if algorithm == "ppo":  # actor and critic on pods of their own
            assert sum("actor" in r for r in roles) == 1 and sum("critic" in r for r in roles) == 1, roles
            assert not any({"actor", "critic"} <= r for r in roles), roles
        else:  # the actor's group spans both pods
            assert all("actor" in r for r in roles), roles
    finally:
        deploy.delete_job(cluster, ns, name)
