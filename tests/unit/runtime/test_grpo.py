"""GRPO: group layout, group-normalised advantages and the loss with clip-higher and KL."""

import math

import pytest
import torch

from rlkube.runtime.algorithms.grpo import (
    fraction_of_groups_with_signal,
    group_layout,
    group_of,
    grpo_advantages,
)
from rlkube.runtime.algorithms.registry import get_policy_loss
from rlkube.runtime.contract.config import TrainingSpec

grpo_loss = get_policy_loss("grpo")  # the objective the RL trainer uses for algorithm grpo


def test_group_layout_is_consecutive():
    assert group_layout(["a", "b"], 3) == ["a", "a", "a", "b", "b", "b"]
    assert [group_of(i, 3) for i in range(6)] == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="groupSize"):
        group_layout(["a"], 0)


def test_grpo_loss_matches_formula_with_clip_higher_and_kl():
    logp = [[-0.2, -1.0], [-2.0, -0.1], [-0.6, -0.4]]
    old = [[-0.5, -1.0], [-1.0, -0.1], [-0.6, -0.9]]
    ref = [[-0.4, -1.2], [-1.5, -0.3], [-0.8, -0.4]]
    mask = [[1, 1], [1, 0], [1, 1]]
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = grpo_advantages(rewards, group_size=3)
    mean, std = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    a = [(r - mean) / (std + 1e-6) for r in [1.0, 0.0, 0.0]]
    assert adv.tolist() == pytest.approx(a, abs=1e-5)

    lo, hi, beta = 0.2, 0.28, 0.04
    terms = []
    for b in range(3):
        for t in range(2):
            if not mask[b][t]:
                continue
            ratio = math.exp(logp[b][t] - old[b][t])
            pg = max(-a[b] * ratio, -a[b] * min(max(ratio, 1 - lo), 1 + hi))
            x = ref[b][t] - logp[b][t]
            terms.append((pg, math.exp(x) - x - 1))
    want = sum(p for p, _ in terms) / len(terms) + beta * sum(k for _, k in terms) / len(terms)
    loss, metrics = grpo_loss(
        torch.tensor(logp), torch.tensor(old), adv, torch.tensor(mask), TrainingSpec(clip=lo, clip_high=hi, kl=beta),
        ref_logprobs=torch.tensor(ref),
    )
    assert float(loss) == pytest.approx(want, abs=1e-5)
    assert metrics["kl"] > 0


def test_clip_higher_lets_positive_advantage_ratio_grow_further():
    logp = torch.tensor([[math.log(1.25)]], requires_grad=True)  # ratio 1.25
    args = (torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    symmetric, _ = grpo_loss(logp, *args, TrainingSpec(clip=0.2))
    symmetric.backward()
    assert logp.grad.item() == 0.0  # clipped at 1.2
    logp.grad = None
    higher, _ = grpo_loss(logp, *args, TrainingSpec(clip=0.2, clip_high=0.28))
    higher.backward()
    assert logp.grad.item() == pytest.approx(-1.25)


def test_fraction_of_groups_with_signal():
    assert fraction_of_groups_with_signal(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2) == 0.5
