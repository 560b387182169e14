"""DPO and IPO losses against the formulas written out here."""

import math

import torch

from rlkube.runtime.algorithms.dpo import PairLogps, ipo_loss, pair_loss, pair_stats, sigmoid_loss


def logps(pc, pr, rc, rr, nc=(1.0,), nr=(1.0,)):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return PairLogps(t(pc), t(pr), t(rc), t(rr), t(nc), t(nr))


def test_sigmoid_loss_matches_formula():
    lp = logps([-3.0, -10.0], [-5.0, -2.0], [-4.0, -9.0], [-4.5, -2.5], [3, 4], [2, 5])
    beta = 0.1
    expected = []
    for pc, pr, rc, rr in [(-3.0, -5.0, -4.0, -4.5), (-10.0, -2.0, -9.0, -2.5)]:
        h = (pc - rc) - (pr - rr)
        expected.append(-math.log(1.0 / (1.0 + math.exp(-beta * h))))
    got = sigmoid_loss(lp, beta)
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(pair_loss(lp, beta, "sigmoid"), got)


def test_sigmoid_loss_is_log2_when_policy_equals_reference():
    lp = logps([-3.0], [-7.0], [-3.0], [-7.0])
    assert abs(float(sigmoid_loss(lp, 0.5)) - math.log(2.0)) < 1e-12


def test_ipo_loss_matches_formula_with_length_normalisation():
    lp = logps([-3.0], [-5.0], [-4.0], [-4.5], [3.0], [2.0])
    beta = 0.25
    h = (-3.0 - -4.0) / 3.0 - (-5.0 - -4.5) / 2.0
    expected = (h - 1.0 / (2.0 * beta)) ** 2
    assert abs(float(ipo_loss(lp, beta)) - expected) < 1e-12
    assert abs(float(pair_loss(lp, beta, "ipo")) - expected) < 1e-12


def test_gradient_pushes_chosen_up_and_rejected_down():
    pc = torch.tensor([-3.0], requires_grad=True)
    pr = torch.tensor([-3.0], requires_grad=True)
    lp = PairLogps(pc, pr, torch.tensor([-3.0]), torch.tensor([-3.0]), torch.ones(1), torch.ones(1))
    sigmoid_loss(lp, 0.1).sum().backward()
    assert pc.grad.item() < 0 < pr.grad.item()  # descending the loss raises chosen, lowers rejected


def test_stats_margin_and_accuracy():
    lp = logps([-1.0, -5.0, -2.0], [-2.0, -1.0, -2.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0])
    losses = sigmoid_loss(lp, 1.0)
    s = pair_stats(lp, losses, 1.0)
    # rewards chosen: 0, -4, -1 ; rejected: -1, 0, -1 -> margins 1, -4, 0 -> one strictly correct
    assert s.pairs == 3 and s.correct == 1
    assert abs(s.margin_sum - (-3.0)) < 1e-9
    assert abs(s.loss_sum - float(losses.sum())) < 1e-9


def test_unknown_loss_type_names_the_field():
    try:
        pair_loss(logps([0.0], [0.0], [0.0], [0.0]), 0.1, "hinge")
    except ValueError as e:
        assert "training.lossType" in str(e)
    else:
        raise AssertionError("expected ValueError")
