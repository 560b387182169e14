"""data.numSamples against batching.globalBatch gets one verdict from pydantic (`rlkube validate`),
the CRD (schema and CEL) and the runtime's config: synthetic data leaves at least a step's samples
to train on after data.evalFraction's hold-out, counted as the trainers make and split their data."""

from __future__ import annotations

import pytest
from rltj_builders import job
from verdicts import assert_one_verdict

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.contract.data_size import held_out_count, made_samples
from rlkube.runtime.data.eval_split import holdout_indices
from rlkube.runtime.data.preferences import load_preference_data
from rlkube.runtime.data.prompts import load_prompt_data
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.trainers.kto import synthetic_unpaired

REFUSED = "spec.data.numSamples"


def synthetic(num_samples: int, eval_fraction: float | None = None, **data) -> dict:
    out = {"source": "synthetic", "format": "synthetic", "numSamples": num_samples, **data}
    return out if eval_fraction is None else {**out, "evalFraction": eval_fraction}


CASES = [
    # (algorithm, data, globalBatch, refused)
    ("dpo", synthetic(32), 32, None),
    ("dpo", synthetic(31), 32, REFUSED),
    ("dpo", synthetic(1), 1, None),
    ("grpo", synthetic(16), 16, None),
    ("grpo", synthetic(15), 16, REFUSED),
    ("ppo", synthetic(15), 16, REFUSED),
    # kto trains on numSamples rounded down to even (each pair's two completions), at least 2
    ("kto", synthetic(32), 32, None),
    ("kto", synthetic(33), 33, REFUSED),
    ("kto", synthetic(1), 2, None),
    # evalFraction holds round(numSamples x fraction) out, at least one, and leaves at least one
    ("dpo", synthetic(36, 0.1), 32, None),
    ("dpo", synthetic(35, 0.1), 32, REFUSED),
    ("dpo", synthetic(32, 0.01), 32, REFUSED),
    ("dpo", synthetic(2, 0.9), 1, None),
    ("dpo", synthetic(1, 0.5), 1, REFUSED),  # nothing left to hold out from
    ("dpo", synthetic(6, 0.25), 4, None),  # 1.5 rounds to 2 (half to even): 4 left
    ("dpo", synthetic(10, 0.25), 8, None),  # 2.5 rounds to 2: 8 left
    ("dpo", synthetic(14, 0.25), 11, REFUSED),  # 3.5 rounds to 4: 10 left
    ("kto", synthetic(9, 0.25), 6, None),
    # data read from files: its count is known only in the pod
    ("dpo", {"source": "/data/pairs.jsonl", "numSamples": 1}, 32, None),
    # the defaults: 512 samples, globalBatch 32
    ("dpo", {"source": "synthetic", "format": "synthetic"}, None, None),
]


@pytest.mark.parametrize("algorithm, data, global_batch, refused", CASES)
def test_num_samples_gets_one_verdict_from_pydantic_the_crd_and_the_runtime(algorithm, data, global_batch, refused):
    batching = {} if global_batch is None else {"batching": {"globalBatch": global_batch}}
    assert_one_verdict(job(algorithm=algorithm, data=data, **batching), refused)


@pytest.mark.parametrize("num_samples", [1, 2, 3, 7, 8])
def test_the_counts_are_those_of_the_data_the_trainers_make(num_samples):
    tokenizer, spec = ByteTokenizer(), DataSpec(source="synthetic", format="synthetic", num_samples=num_samples)
    assert len(load_preference_data(spec, tokenizer, "byte", None)) == made_samples("dpo", num_samples)
    assert len(load_prompt_data(spec, tokenizer, max_new_tokens=16)) == made_samples("grpo", num_samples)
    assert len(synthetic_unpaired(spec, tokenizer)) == made_samples("kto", num_samples)


@pytest.mark.parametrize("samples", [2, 3, 5, 10, 14, 33])
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.25, 0.5, 0.9, 0.99])
def test_the_held_out_count_is_the_split_the_trainers_make(samples, fraction):
    train, held = holdout_indices(samples, fraction, seed=0)
    assert (len(train), len(held)) == (samples - held_out_count(samples, fraction), held_out_count(samples, fraction))
    assert sorted(train + held) == list(range(samples))
