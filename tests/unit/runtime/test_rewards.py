"""Rule-based rewards by import path, the toy task's reward, and the reward-model wrapper."""

import pytest
import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.rewards import load_reward_function, score_with_function, target_pattern
from rlkube.runtime.rewards.model import build_reward_model

torch.set_num_threads(1)


def test_target_pattern_is_the_fraction_of_lowercase_letters():
    assert target_pattern("p", "abc") == 1.0
    assert target_pattern("p", "aB1c") == 0.5
    assert target_pattern("p", "") == 0.0


def test_load_reward_function_by_import_path():
    assert load_reward_function("rlkube.runtime.rewards:target_pattern") is target_pattern
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        load_reward_function("no_such_module:f")
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        load_reward_function("rlkube.runtime.rewards:nope")


def test_non_finite_rewards_are_named_errors():
    with pytest.raises(ValueError, match="returned nan"):
        score_with_function(lambda p, c: float("nan"), ["x"], ["y"])


def test_reward_model_scores_each_row_at_its_last_real_token():
    spec = ModelSpec(config={"model_type": "qwen2", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64,
                             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2},
                     dtype="float32", attention="sdpa")
    rm = build_reward_model(spec, torch.device("cpu"), pad_token_id=0, seed=1)
    rows = [[5, 6, 7, 8, 9], [3, 4], [10, 11, 12]]
    # left-padded prompt block of 2 columns, then responses right-padded to 3 columns
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 3, 4, 0, 0], [10, 11, 12, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    batch = rm(ids, mask)
    alone = torch.stack([rm(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in rows])
    assert batch.shape == (3,) and batch.dtype == torch.float32
    assert torch.allclose(batch, alone, atol=1e-5)
    assert not any(p.requires_grad for p in rm.parameters())
