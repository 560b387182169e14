"""PPO losses against formulas written out per token in plain Python."""

import math

import pytest
import torch

from rlkube.runtime.algorithms.ppo import (
    actor_loss,
    entropy_from_logits,
    kl_divergence,
    policy_loss,
    shaped_rewards,
    value_loss,
)

LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
OLD = [[-1.1, -0.9, -1.0], [-0.3, -0.2, -0.7]]
ADV = [[1.0, -0.5, 2.0], [0.3, 1.5, -1.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def per_token_clipped(logp, old, adv, lo, hi):
    ratio = math.exp(logp - old)
    return max(-adv * ratio, -adv * min(max(ratio, 1 - lo), 1 + hi))


def token_mean(fn):
    vals = [fn(b, t) for b in range(2) for t in range(3) if MASK[b][t]]
    return sum(vals) / len(vals)


@pytest.mark.parametrize("lo,hi", [(0.2, None), (0.2, 0.28), (0.1, 0.5)])
def test_policy_loss_matches_per_token_formula(lo, hi):
    loss, stats = policy_loss(
        torch.tensor(LOGP), torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), lo, hi
    )
    h = lo if hi is None else hi
    want = token_mean(lambda b, t: per_token_clipped(LOGP[b][t], OLD[b][t], ADV[b][t], lo, h))
    assert float(loss) == pytest.approx(want, abs=1e-6)
    clipped = token_mean(
        lambda b, t: float(
            per_token_clipped(LOGP[b][t], OLD[b][t], ADV[b][t], lo, h)
            > -ADV[b][t] * math.exp(LOGP[b][t] - OLD[b][t]) + 1e-12
        )
    )
    assert float(stats.clip_fraction) == pytest.approx(clipped)
    assert float(stats.approx_kl) == pytest.approx(token_mean(lambda b, t: OLD[b][t] - LOGP[b][t]), abs=1e-6)


def test_policy_loss_gradient_is_zero_on_clipped_tokens():
    logp = torch.tensor([[0.5, 0.0]], requires_grad=True)  # ratio e^0.5 ~ 1.65 (clipped), 1.0 (free)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2)
    loss.backward()
    # d/dlogp of -A*ratio/2 at ratio 1 is -0.5; the clipped token gets nothing.
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5])


def test_value_loss_matches_formula():
    v = [[0.5, 1.5, 0.0], [2.0, -1.0, 9.0]]
    old = [[0.4, 1.0, 0.0], [1.0, -0.9, 0.0]]
    ret = [[1.0, 0.0, 0.3], [1.1, -2.0, 0.0]]
    c = 0.2

    def term(b, t):
        vc = old[b][t] + min(max(v[b][t] - old[b][t], -c), c)
        return 0.5 * max((v[b][t] - ret[b][t]) ** 2, (vc - ret[b][t]) ** 2)

    loss, frac = value_loss(torch.tensor(v), torch.tensor(old), torch.tensor(ret), torch.tensor(MASK), c)
    assert float(loss) == pytest.approx(token_mean(term), abs=1e-6)
    assert 0.0 <= frac <= 1.0


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0, -0.2]), torch.tensor([-0.5, -0.9])
    k1 = kl_divergence(logp, ref, "k1")
    k3 = kl_divergence(logp, ref, "k3")
    assert k1.tolist() == pytest.approx([-1.0 + 0.5, -0.2 + 0.9])
    want_k3 = [math.exp(r - p) - (r - p) - 1 for p, r in zip([-1.0, -0.2], [-0.5, -0.9], strict=True)]
    assert k3.tolist() == pytest.approx(want_k3, abs=1e-6)
    assert (k3 >= 0).all()
    k2 = kl_divergence(logp, ref, "k2")
    assert k2.tolist() == pytest.approx([0.5 * (r - p) ** 2 for p, r in zip([-1.0, -0.2], [-0.5, -0.9], strict=True)])
    with pytest.raises(ValueError, match="klEstimator"):
        kl_divergence(logp, ref, "k4")


def test_k3_is_finite_on_extreme_ratios():
    k3 = kl_divergence(torch.tensor([0.0]), torch.tensor([-1e4]), "k3")
    assert torch.isfinite(k3).all()


def test_shaped_rewards_put_score_on_last_token_and_kl_on_every_token():
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.5, -0.7, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    r = shaped_rewards(torch.tensor([2.0, -1.0]), logp, ref, mask, kl_coef=0.1, estimator="k1")
    k1 = (logp - ref) * mask
    want = -0.1 * k1
    want[0, 2] += 2.0
    want[1, 1] += -1.0
    assert torch.allclose(r, want, atol=1e-6)
    assert r[1, 2] == 0


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    h = entropy_from_logits(logits)
    p = [math.exp(10) / (math.exp(10) + 3)] + [1 / (math.exp(10) + 3)] * 3
    assert h.tolist() == pytest.approx([math.log(4), -sum(q * math.log(q) for q in p)], abs=1e-5)


def test_actor_loss_combines_terms():
    logp = torch.tensor(LOGP)
    ref = torch.tensor(OLD) - 0.1
    ent = torch.ones(2, 3) * 0.7
    base, _ = policy_loss(logp, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), 0.2)
    kl = token_mean(lambda b, t: math.exp(OLD[b][t] - 0.1 - LOGP[b][t]) - (OLD[b][t] - 0.1 - LOGP[b][t]) - 1)
    loss, metrics = actor_loss(
        logp, torch.tensor(OLD), torch.tensor(ADV), torch.tensor(MASK), 0.2, None,
        ref_logprobs=ref, kl_coef=0.05, kl_estimator="k3", entropy=ent, entropy_coef=0.01,
    )
    assert float(loss) == pytest.approx(float(base) + 0.05 * kl - 0.01 * 0.7, abs=1e-6)
    assert metrics["kl"] == pytest.approx(kl, abs=1e-6) and metrics["entropy"] == pytest.approx(0.7)
