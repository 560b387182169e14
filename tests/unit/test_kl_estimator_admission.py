"""klEstimator k1 as a KL loss term gets one verdict from pydantic, the CRD's CEL and the runtime."""

import pytest
from rltj_builders import job
from verdicts import three_verdicts

from rlkube.operator.api import crd

CRD = crd.crd_manifest()
PATH = "spec.training.klEstimator"
CASES = [
    ("grpo", {"kl": 0.05, "klEstimator": "k1"}, PATH),
    ("grpo", {"kl": 0.05, "klEstimator": "k1", "klInReward": True}, PATH),  # grpo has no per-token rewards
    ("grpo", {"kl": 0.0, "klEstimator": "k1"}, None),  # no KL, nothing to estimate
    ("grpo", {"kl": 0.05, "klEstimator": "k2"}, None),
    ("grpo", {"kl": 0.05, "klEstimator": "k3"}, None),
    ("ppo", {"kl": 0.05, "klEstimator": "k1"}, PATH),
    ("ppo", {"kl": 0.05, "klEstimator": "k1", "klInReward": True}, None),  # a reward penalty: fine
    ("ppo", {"kl": 0.05, "klEstimator": "k2", "klInReward": False}, None),
    ("dpo", {"klEstimator": "k1"}, None),
]


@pytest.mark.parametrize("algorithm, training, refused", CASES)
def test_k1_as_a_loss_term_is_refused_everywhere(algorithm, training, refused):
    roles = {"actor": {"gpus": 1}}
    if algorithm != "dpo":
        roles = {**roles, "reward": {"gpus": 0, "function": "rlkube.runtime.rewards:target_pattern"},
                 "reference": {"colocateWith": "actor"}}
    if algorithm == "ppo":
        roles["critic"] = {"colocateWith": "actor"}
    obj = job(algorithm=algorithm, roles=roles, training=training)
    pydantic_paths, crd_errors, runtime_error = three_verdicts(obj)
    if refused is None:
        assert (pydantic_paths, crd_errors, runtime_error) == ([], [], "")
    else:
        assert pydantic_paths == [refused]
        assert crd_errors and all("training.klEstimator" in e for e in crd_errors), crd_errors
        assert "expected gradient" in runtime_error
        assert refused.removeprefix("spec.") in runtime_error
