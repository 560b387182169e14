"""rollout.decodeRows gets one verdict from pydantic (`rlkube validate`), the CRD (schema and CEL)
and the runtime's config: at least 1, and at most the rows each actor GPU generates per step
(globalBatch x groupSize / roles.actor.gpus), PPO and GRPO only."""

from __future__ import annotations

import pytest
from rltj_builders import job
from verdicts import assert_one_verdict

# The builders' jobs: globalBatch 32 (the default), groupSize 4 (the default), 2 actor GPUs, so
# grpo generates 32 x 4 / 2 = 64 rows per actor GPU and ppo 32 / 2 = 16.
CASES = [
    ("grpo", {"rollout": {"decodeRows": 64, "refill": False}}, None),
    ("grpo", {"rollout": {"decodeRows": 1}}, None),
    ("grpo", {"rollout": {"decodeRows": 65}}, "spec.rollout.decodeRows"),
    ("grpo", {"rollout": {"decodeRows": 64}, "training": {"groupSize": 2}}, "spec.rollout.decodeRows"),
    ("grpo", {"rollout": {"decodeRows": 32}, "training": {"groupSize": 2}}, None),
    ("grpo", {"rollout": {"decodeRows": 64}, "batching": {"globalBatch": 16}}, "spec.rollout.decodeRows"),
    ("grpo", {"rollout": {"decodeRows": 0}}, "spec.rollout.decodeRows"),
    ("ppo", {"rollout": {"decodeRows": 16}}, None),
    ("ppo", {"rollout": {"decodeRows": 17}}, "spec.rollout.decodeRows"),
    ("dpo", {"rollout": {"decodeRows": 1000}}, None),  # DPO never rolls out
]


@pytest.mark.parametrize("algorithm, overrides, refused", CASES)
def test_decode_rows_get_one_verdict_from_pydantic_the_crd_and_the_runtime(algorithm, overrides, refused):
    obj = job(algorithm=algorithm, **overrides)
    assert_one_verdict(obj, refused)
