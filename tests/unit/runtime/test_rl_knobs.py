"""The RL knobs against formulas written out here: KL estimators (values and expected gradients),
GRPO's scaleRewards, the loss aggregations, and their names in the registry and the config."""

import math
import typing

import pytest
import torch

from rlkube.runtime.algorithms.ppo import actor_loss, kl_divergence, kl_loss
from rlkube.runtime.algorithms.registry import get_adv_estimator, get_loss_agg, loss_agg_names
from rlkube.runtime.contract.config import TrainingSpec


def test_kl_estimators_expected_gradients_on_policy():
    """Exact expectations over a 5-token vocabulary, x ~ pi, the sampling weights not differentiated:
    k1 -> 0, k2 -> grad KL(pi || ref), k3 -> grad KL(ref || pi)."""
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(5, dtype=torch.float64), 0)
    tokens = torch.arange(5)

    def expected_grad(estimator):
        logp = torch.log_softmax(theta, 0)
        per_token = kl_divergence(logp[tokens], ref[tokens], estimator)
        (g,) = torch.autograd.grad((logp.exp().detach() * per_token).sum(), theta)
        return g

    def grad_of(kl):
        (g,) = torch.autograd.grad(kl(torch.log_softmax(theta, 0)), theta)
        return g

    reverse = grad_of(lambda logp: (logp.exp() * (logp - ref)).sum())  # KL(pi || ref)
    forward = grad_of(lambda logp: (ref.exp() * (ref - logp)).sum())  # KL(ref || pi)
    assert torch.allclose(expected_grad("k1"), torch.zeros(5, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(expected_grad("k2"), reverse, atol=1e-12)
    assert torch.allclose(expected_grad("k3"), forward, atol=1e-12)
    # As values, k1 and k3 are unbiased for KL(pi || ref).
    with torch.no_grad():
        logp = torch.log_softmax(theta, 0)
        kl = float((logp.exp() * (logp - ref)).sum())
        for estimator in ("k1", "k3"):
            assert float((logp.exp() * kl_divergence(logp, ref, estimator)).sum()) == pytest.approx(kl, rel=1e-12)


def test_k1_is_refused_as_a_loss_term():
    logp, ref, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="klEstimator.*zero expected gradient"):
        kl_loss(logp, ref, mask, "k1")


L = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 7.0, 7.0], [6.0, 8.0, 8.0, 8.0]])
M = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "name, want, weight",
    [
        ("token-mean", (1 + 2 + 3 + 4 + 5 + 6) / 6, 6.0),
        ("seq-mean-token-sum", ((1 + 2 + 3) + (4 + 5) + 6) / 3, 3.0),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + (4 + 5) / 2 + 6 / 1) / 3, 3.0),
    ],
)
def test_loss_aggregations(name, want, weight):
    agg = get_loss_agg(name)
    assert float(agg(L, M)) == pytest.approx(want)
    assert agg.weight(M) == weight
    # The weighted mean of the parts' aggregates is the whole's (how update.py combines micro-batches).
    parts = [(L[:1], M[:1]), (L[1:], M[1:])]
    combined = sum(float(agg(x, m)) * agg.weight(m) for x, m in parts) / sum(agg.weight(m) for _, m in parts)
    assert combined == pytest.approx(want)


def test_every_aggregation_the_config_accepts_is_registered_and_no_other():
    names = typing.get_args(TrainingSpec.model_fields["loss_aggregation"].annotation)
    assert sorted(names) == loss_agg_names()
    with pytest.raises(ValueError, match="not registered; valid: seq-mean-token-mean, seq-mean-token-sum, token-mean"):
        get_loss_agg("sum")


def test_actor_loss_aggregates_every_term():
    """policy + kl_coef * k3 - entropy_coef * H, each by seq-mean-token-mean (ratio 1: old = new)."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -0.4, 0.0, 0.0], [-2.0, 0.0, 0.0, 0.0]])
    ref = logp - 0.25 * M
    adv = torch.tensor([1.0, -2.0, 0.5])
    ent = torch.full_like(logp, 0.7)
    loss, _ = actor_loss(logp, logp, adv, M, 0.2, None, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3",
                         entropy=ent, entropy_coef=0.01, aggregate=get_loss_agg("seq-mean-token-mean"))
    k3 = math.exp(-0.25) + 0.25 - 1.0  # the same on every valid token
    want = (-1.0 + 2.0 - 0.5) / 3 + 0.1 * k3 - 0.01 * 0.7
    assert float(loss) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_scale_rewards(scale):
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 2.0])
    t = TrainingSpec.model_validate({"groupSize": 3, "scaleRewards": scale})
    adv = get_adv_estimator("grpo")({"scores": rewards}, torch.ones(6, 2), t)["advantages"]
    want = []
    for group in ([1.0, 0.0, 0.0], [3.0, 2.0, 2.0]):
        mean = sum(group) / 3
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 2)  # unbiased sample std
        want += [(r - mean) / (std + 1e-6) if scale else r - mean for r in group]
    assert adv.tolist() == pytest.approx(want, rel=1e-6)
