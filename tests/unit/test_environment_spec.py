"""roles.environment and roles.reward.remote: what a job may say, and the field each refusal names,
in `rlkube validate`'s and the operator's words and in the trainer's (the same rules)."""

from __future__ import annotations

import pytest
from rltj_builders import REWARD_FUNCTION, job

from rlkube.operator import api
from rlkube.runtime.contract.config import RuntimeConfig

ENVIRONMENT = {"image": "localhost/rlkube/environment:dev", "replicas": 2}
REMOTE_GRPO = {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"},
               "reward": {"gpus": 0, "remote": True}, "environment": ENVIRONMENT}


def errors(**spec) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in api.job_errors(job(**spec))]


def test_a_grpo_job_scoring_through_its_environment_is_valid():
    assert errors(algorithm="grpo", roles=REMOTE_GRPO) == []
    parsed = api.parse_job(job(algorithm="grpo", roles=REMOTE_GRPO))
    environment = parsed.spec.roles.environment
    assert (environment.replicas, environment.port, environment.allow_egress) == (2, 8000, False)
    assert parsed.spec.roles.reward.remote is True
    assert "environment" not in parsed.spec.device_map()  # no GPUs, not in the device map


def test_an_environment_beside_a_function_reward_is_valid():
    roles = {**REMOTE_GRPO, "reward": {"gpus": 0, "function": REWARD_FUNCTION}}
    assert errors(algorithm="grpo", roles=roles) == []


@pytest.mark.parametrize("change, path, words", [
    ({"environment": {**ENVIRONMENT, "replicas": 0}}, "spec.roles.environment.replicas", ">= 1"),
    ({"environment": {**ENVIRONMENT, "port": 70000}}, "spec.roles.environment.port", "65535"),
    ({"environment": {**ENVIRONMENT, "port": 0}}, "spec.roles.environment.port", ">= 1"),
    ({"environment": {"replicas": 1}}, "spec.roles.environment.image", "required"),
    ({"environment": {**ENVIRONMENT, "env": [{"name": "A B"}]}}, "spec.roles.environment.env[0].name", "must match"),
    ({"environment": None}, "spec.roles.reward.remote", "needs roles.environment"),
    ({"reward": {"gpus": 1, "remote": True}}, "spec.roles.reward.gpus", "gpus to 0"),
    ({"reward": {"gpus": 0, "remote": True, "function": REWARD_FUNCTION}}, "spec.roles.reward", "not several"),
    ({"critic": {"gpus": 0, "remote": True}}, "spec.roles.critic.remote", "only the reward role"),
    ({"environment": {**ENVIRONMENT, "client": {"concurrency": 0}}}, "spec.roles.environment.client.concurrency",
     ">= 1"),
    ({"environment": {**ENVIRONMENT, "client": {"batchSize": 1000}}}, "spec.roles.environment.client.batchSize",
     "256"),
    ({"environment": {**ENVIRONMENT, "client": {"timeoutSeconds": 0}}},
     "spec.roles.environment.client.timeoutSeconds", "> 0"),
    ({"environment": {**ENVIRONMENT, "allowEgress": "yes"}}, "spec.roles.environment.allowEgress",
     "must be true or false"),
    ({"environment": {**ENVIRONMENT, "allowEgress": 1}}, "spec.roles.environment.allowEgress",
     "must be true or false"),
])
def test_mistakes_name_their_field(change, path, words):
    roles = {k: v for k, v in {**REMOTE_GRPO, **change}.items() if v is not None}
    found = errors(algorithm="grpo", roles=roles)
    assert any(p == path and words in m for p, m in found), found


def test_only_rl_algorithms_take_an_environment():
    roles = {"actor": {"gpus": 2}, "reference": {"colocateWith": "actor"}, "environment": ENVIRONMENT}
    found = errors(algorithm="dpo", roles=roles)
    assert any(p == "spec.roles.environment" and "only ppo and grpo" in m for p, m in found), found


def test_the_trainer_reads_the_same_sections():
    spec = api.parse_job(job(algorithm="grpo", roles=REMOTE_GRPO)).spec
    config = RuntimeConfig.model_validate(spec.runtime_config(device_map=spec.device_map()).model_dump())
    assert config.roles.reward.remote and config.roles.environment.replicas == 2
