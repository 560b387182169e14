"""rollout.maxTurns, rollout.maxEpisodeTokens and rollout.tools get one verdict from pydantic
(`rlkube validate`), the CRD (schema and CEL) and the runtime's config: maxTurns > 1 needs tools
and tools need maxTurns > 1, ppo and grpo only; maxEpisodeTokens only with maxTurns > 1, at least
maxNewTokens and within data.maxSeqLen - 2; tools name exactly one executor (function, or remote:
true with roles.environment)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from rltj_builders import job
from verdicts import assert_one_verdict

from rlkube.runtime.contract.config import RolloutSpec

TOOLS = {"function": "rlkube.runtime.tools.calculator:calculator"}
ENVIRONMENT = {"image": "localhost/rlkube/environment:dev"}
# The builders' jobs have data.maxSeqLen 64 and rollout.maxNewTokens 16.
CASES = [
    ("grpo", {}, None),
    ("grpo", {"rollout": {"maxTurns": 1}}, None),
    ("grpo", {"rollout": {"maxTurns": 4, "tools": TOOLS}}, None),
    ("ppo", {"rollout": {"maxTurns": 2, "tools": TOOLS, "maxEpisodeTokens": 48}}, None),
    ("grpo", {"rollout": {"maxTurns": 2}}, "spec.rollout.maxTurns"),
    ("grpo", {"rollout": {"tools": TOOLS}}, "spec.rollout.tools"),
    ("grpo", {"rollout": {"maxTurns": 0}}, "spec.rollout.maxTurns"),
    ("dpo", {"rollout": {"maxTurns": 2, "tools": TOOLS}}, "spec.rollout.maxTurns"),
    ("grpo", {"rollout": {"maxEpisodeTokens": 32}}, "spec.rollout.maxEpisodeTokens"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": TOOLS, "maxEpisodeTokens": 8}}, "spec.rollout.maxEpisodeTokens"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": TOOLS, "maxEpisodeTokens": 63}}, "spec.rollout.maxEpisodeTokens"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": TOOLS, "maxEpisodeTokens": 62}}, None),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {"function": "not a path"}}}, "spec.rollout.tools.function"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {"remote": True}}, "roles": {"environment": ENVIRONMENT}}, None),
    ("ppo", {"rollout": {"maxTurns": 3, "tools": {"remote": True}}, "roles": {"environment": ENVIRONMENT}}, None),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {"remote": True}}}, "spec.rollout.tools.remote"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {**TOOLS, "remote": True}}, "roles": {"environment": ENVIRONMENT}},
     "spec.rollout.tools"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {}}}, "spec.rollout.tools"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {"remote": False}}}, "spec.rollout.tools"),
    ("grpo", {"rollout": {"maxTurns": 2, "tools": {**TOOLS, "remote": False}}}, None),
]


@pytest.mark.parametrize("algorithm, overrides, refused", CASES)
def test_multi_turn_fields_get_one_verdict(algorithm, overrides, refused):
    base = job(algorithm=algorithm)
    spec = base["spec"]
    spec.setdefault("data", {})["maxSeqLen"] = 64
    spec.setdefault("rollout", {})["maxNewTokens"] = 16
    for section, fields in overrides.items():
        spec.setdefault(section, {}).update(fields)
    assert_one_verdict(base, refused)


def test_the_error_says_what_to_set():
    from rlkube.runtime.contract.config import RuntimeConfig

    with pytest.raises(ValidationError, match=r"rollout.maxTurns: > 1 needs rollout.tools.*\(maxTurns is 3\)"):
        RuntimeConfig.model_validate({
            "algorithm": "grpo", "model": {"config": {"model_type": "qwen2"}},
            "roles": {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": "m:f"}},
            "data": {"source": "s", "format": "synthetic"}, "rollout": {"maxTurns": 3}})


@pytest.mark.parametrize("tools, says", [
    ({}, "; it has none"),
    ({**TOOLS, "remote": True}, "; it has function, remote"),
    ({"remote": True}, "rollout.tools.remote: tool calls answered by the environment need roles.environment"),
])
def test_the_tools_error_names_the_field(tools, says):
    from rlkube.runtime.contract.config import RuntimeConfig

    with pytest.raises(ValidationError, match=re.escape(says)):
        RuntimeConfig.model_validate({
            "algorithm": "grpo", "model": {"config": {"model_type": "qwen2"}},
            "roles": {"actor": {"gpus": 1}, "reward": {"gpus": 0, "function": "m:f"}},
            "data": {"source": "s", "format": "synthetic"}, "rollout": {"maxTurns": 3, "tools": tools}})


def test_episode_tokens_default_to_one_turn():
    assert RolloutSpec(max_new_tokens=16).episode_tokens == 16
    assert RolloutSpec(max_new_tokens=16, max_turns=2, max_episode_tokens=40).episode_tokens == 40
    assert not RolloutSpec().multi_turn and RolloutSpec(max_turns=2).multi_turn
