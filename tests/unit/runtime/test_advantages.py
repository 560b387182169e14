"""GAE and GRPO advantages against formulas written out here, loop by loop."""

import math

import pytest
import torch

from rlkube.runtime.algorithms.advantages import gae, group_normalized_advantages, masked_mean, whiten


def reference_gae(rewards, values, gamma, lam):
    """Textbook GAE for one episode given as plain lists (no masks)."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_v = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_v - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def test_gae_matches_textbook_on_one_unmasked_episode():
    rewards = [0.1, -0.2, 0.0, 1.0]
    values = [0.5, 0.3, -0.1, 0.2]
    adv, ret = gae(torch.tensor([rewards]), torch.tensor([values]), torch.ones(1, 4), gamma=0.9, lam=0.8)
    want_adv, want_ret = reference_gae(rewards, values, 0.9, 0.8)
    assert adv[0].tolist() == pytest.approx(want_adv, abs=1e-6)
    assert ret[0].tolist() == pytest.approx(want_ret, abs=1e-6)


def test_gae_last_token_hand_computed():
    # Two tokens, gamma 1, lambda 1: A_1 = r_1 - V_1; A_0 = r_0 + V_1 - V_0 + A_1 = r_0 + r_1 - V_0.
    adv, _ = gae(torch.tensor([[0.0, 2.0]]), torch.tensor([[0.5, 0.25]]), torch.ones(1, 2), 1.0, 1.0)
    assert adv[0].tolist() == pytest.approx([2.0 - 0.5, 2.0 - 0.25])


def test_gae_masked_rows_of_different_lengths_equal_separate_episodes():
    # Row 0: prompt (masked) then 3 response tokens; row 1: response of 2 tokens then padding.
    rewards = torch.tensor([[9.0, 0.0, 0.5, 1.0], [0.3, -1.0, 9.0, 9.0]])
    values = torch.tensor([[9.0, 0.2, 0.1, 0.4], [0.6, 0.7, 9.0, 9.0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    a0, r0 = reference_gae([0.0, 0.5, 1.0], [0.2, 0.1, 0.4], 0.95, 0.9)
    a1, r1 = reference_gae([0.3, -1.0], [0.6, 0.7], 0.95, 0.9)
    assert adv[0, 1:].tolist() == pytest.approx(a0, abs=1e-6)
    assert adv[1, :2].tolist() == pytest.approx(a1, abs=1e-6)
    assert ret[0, 1:].tolist() == pytest.approx(r0, abs=1e-6)
    assert ret[1, :2].tolist() == pytest.approx(r1, abs=1e-6)
    # Masked positions are exactly zero: the 9s never leak.
    assert adv[0, 0] == 0 and adv[1, 2:].abs().sum() == 0 and ret[1, 2:].abs().sum() == 0


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)


def test_whiten_and_masked_mean():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert float(masked_mean(x, mask)) == pytest.approx(2.5)
    w = whiten(x, mask)
    valid = torch.tensor([1.0, 2.0, 3.0, 4.0])
    want = (valid - 2.5) / math.sqrt(((valid - 2.5) ** 2).mean() + 1e-8)
    assert w[mask.bool()].tolist() == pytest.approx(want.tolist(), abs=1e-5)
    assert w[:, 2].abs().sum() == 0


def test_group_normalized_advantages_formula():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0])
    adv = group_normalized_advantages(rewards, group_size=4)
    g = [1.0, 0.0, 0.5, 0.5]
    mean = sum(g) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in g) / 3)  # unbiased
    assert adv[:4].tolist() == pytest.approx([(r - mean) / (std + 1e-6) for r in g], abs=1e-5)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # identical rewards: no signal
    centered = group_normalized_advantages(rewards, group_size=4, scale_by_std=False)
    assert centered[:4].tolist() == pytest.approx([r - mean for r in g])


def test_group_normalized_advantages_rejects_bad_layout():
    with pytest.raises(ValueError, match="groupSize=3"):
        group_normalized_advantages(torch.zeros(8), group_size=3)


def test_gae_skips_the_masked_gaps_between_turns():
    """A multi-turn row's tool tokens (mask 0 between valid tokens) are skipped: the result is GAE
    over the row's valid tokens moved together, put back in place; a row without gaps is as before."""
    rewards = torch.tensor([[0.0, 0.1, 9.0, 9.0, 0.2, 1.0, 0.0], [0.3, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.2, 0.4, 5.0, 5.0, 0.1, 0.3, 7.0], [0.6, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    a0, r0 = reference_gae([0.0, 0.1, 0.2, 1.0], [0.2, 0.4, 0.1, 0.3], 0.95, 0.9)
    a1, r1 = reference_gae([0.3, 0.5], [0.6, 0.7], 0.95, 0.9)
    assert torch.allclose(adv[0, [0, 1, 4, 5]], torch.tensor(a0))
    assert torch.allclose(ret[0, [0, 1, 4, 5]], torch.tensor(r0))
    assert torch.allclose(adv[1, :2], torch.tensor(a1)) and torch.allclose(ret[1, :2], torch.tensor(r1))
    assert adv[0, [2, 3, 6]].abs().sum() == 0 and ret[0, [2, 3, 6]].abs().sum() == 0
    # without gaps: the same numbers as before, bit for bit
    plain = mask.clone()
    plain[0] = torch.tensor([1, 1, 1, 1, 0, 0, 0])
    want = gae(rewards, values, plain, 0.95, 0.9)
    assert all(torch.equal(x, y) for x, y in zip(want, gae(rewards, values, plain.float(), 0.95, 0.9), strict=True))


def test_group_advantages_leave_out_rows_that_do_not_count():
    """A completion masked out of the loss (a failed tool call) gets 0 and takes no part in its
    group's mean and std; a group with fewer than two that count gets 0; all valid: unchanged."""
    rewards = torch.tensor([1.0, 0.0, 100.0, 0.5, 2.0, 7.0, 3.0, 4.0])
    valid = torch.tensor([True, True, False, True, False, True, False, False])
    out = group_normalized_advantages(rewards, 4, valid=valid)
    kept = torch.tensor([1.0, 0.0, 0.5])
    want = (kept - kept.mean()) / (kept.std() + 1e-6)
    assert torch.allclose(out[[0, 1, 3]], want)
    assert out[2] == 0 and out[4:].abs().sum() == 0
    every = torch.ones(8, dtype=torch.bool)
    assert torch.equal(group_normalized_advantages(rewards, 4, valid=every), group_normalized_advantages(rewards, 4))
