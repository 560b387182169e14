"""The algorithm registry: recipes by name, estimators and losses picked by name, clear errors."""

import math

import pytest
import torch

from rlkube.runtime.algorithms.registry import (
    get_adv_estimator,
    get_policy_loss,
    register_adv_est,
    register_policy_loss,
    rl_algorithm,
)
from rlkube.runtime.contract.config import TrainingSpec


@pytest.mark.parametrize(
    ("name", "estimator", "loss", "critic", "grouped"),
    [("ppo", "gae", "ppo", True, False), ("grpo", "grpo", "grpo", False, True)],
)
def test_recipes_name_their_estimator_loss_and_roles(name, estimator, loss, critic, grouped):
    algo = rl_algorithm(name)
    assert (algo.advantage_estimator, algo.policy_loss, algo.critic, algo.grouped) == (estimator, loss, critic, grouped)
    assert get_adv_estimator(algo.advantage_estimator) is not None
    assert get_policy_loss(algo.policy_loss) is not None
    assert algo.group_size(TrainingSpec(group_size=8)) == (8 if grouped else 1)


@pytest.mark.parametrize(
    ("lookup", "name", "valid"),
    [(get_adv_estimator, "vtrace", "valid: gae, grpo"), (get_policy_loss, "reinforce", "valid: grpo, ppo"),
     (rl_algorithm, "dpo", "algorithm: 'dpo' is not an RL algorithm; valid: grpo, ppo")],
)
def test_unknown_names_list_the_valid_ones(lookup, name, valid):
    with pytest.raises(ValueError, match=valid):
        lookup(name)


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="'gae' is registered already"):
        register_adv_est("gae")(lambda scored, mask, t: {})
    with pytest.raises(ValueError, match="'ppo' is registered already"):
        register_policy_loss("ppo")(lambda *a, **k: None)


def test_kl_goes_into_the_reward_only_where_rewards_are_per_token():
    ppo, grpo = rl_algorithm("ppo"), rl_algorithm("grpo")
    in_reward = TrainingSpec(kl=0.1, kl_in_reward=True)
    assert ppo.kl_in_reward(in_reward) and not ppo.kl_as_loss(in_reward)
    assert not grpo.kl_in_reward(in_reward) and grpo.kl_as_loss(in_reward)
    assert not ppo.kl_as_loss(TrainingSpec(kl=0.0))


def test_gae_estimator_against_a_hand_computed_rollout():
    # One response of two tokens, score 1 on the last one, gamma = lambda = 1:
    # A_1 = 1 - V_1 = 0.75; A_0 = (V_1 - V_0) + A_1 = 0.5; returns = A + V = [1, 1];
    # whitened: mean 0.625, std 0.125 -> [-1, 1].
    scored = {"scores": torch.tensor([1.0]), "values": torch.tensor([[0.5, 0.25]])}
    out = get_adv_estimator("gae")(scored, torch.ones(1, 2), TrainingSpec(gamma=1.0, gae_lambda=1.0))
    assert out["returns"][0].tolist() == pytest.approx([1.0, 1.0])
    assert out["advantages"][0].tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)


def test_grpo_estimator_normalises_within_groups_of_group_size():
    scored = {"scores": torch.tensor([1.0, 0.0, 0.5, 0.5])}
    out = get_adv_estimator("grpo")(scored, torch.ones(4, 1), TrainingSpec(group_size=2))
    s = math.sqrt(0.5)  # sample std of {1, 0}
    assert out["advantages"].tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0], abs=1e-5)


def test_ppo_loss_clips_symmetrically_whatever_clip_high_says():
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)  # ratio 1.25, advantage 1
    args = (torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), TrainingSpec(clip=0.2, clip_high=0.28))
    get_policy_loss("ppo")(logp, *args)[0].backward()
    assert logp.grad.item() == 0.0  # clipped at 1.2
    logp.grad = None
    get_policy_loss("grpo")(logp, *args)[0].backward()
    assert logp.grad.item() == pytest.approx(-1.25)


def test_every_algorithm_of_the_spec_has_its_trainer_and_each_online_one_its_recipe():
    import importlib.util

    from rlkube.runtime.contract.algorithms import ALGORITHMS, ONLINE_ALGORITHMS

    for entry in ALGORITHMS.values():
        assert importlib.util.find_spec(entry.trainer) is not None, entry
        if entry.online:
            assert rl_algorithm(entry.name).name == entry.name
        else:
            with pytest.raises(ValueError, match="not an RL algorithm"):
                rl_algorithm(entry.name)
    assert set(ONLINE_ALGORITHMS) == {"ppo", "grpo"}

