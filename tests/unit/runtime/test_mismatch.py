"""The mismatch fields (trainers/rl/mismatch.py) against numbers written out by hand."""

import math

import pytest
import torch

from rlkube.runtime.trainers.rl.mismatch import RowMismatch, fields_of, row_stats
from rlkube.runtime.trainers.rl.rollout import Rollout

GEN = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -9.0]])
TRAIN = torch.tensor([[-1.5, -2.0, -0.25], [-2.0, -7.0, -9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])  # row 1: one policy token (the others are padding or tools)
# r = train - gen at the masked tokens: -0.5, 0, 0.25 | 1.0
R = [-0.5, 0.0, 0.25, 1.0]


def k3(r: float) -> float:
    return math.exp(r) - 1 - r


def test_row_stats_by_hand():
    got = row_stats(GEN, TRAIN, MASK)
    assert got.dtype == torch.float64
    want = [[0.75, 0.25, k3(-0.5) + k3(0.0) + k3(0.25), 3, 0.5], [1.0, -1.0, k3(1.0), 1, 1.0]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_fields_are_token_means_and_a_copy_written_twice_counts_once():
    rows = torch.cat([row_stats(GEN, TRAIN, MASK), torch.ones(2, 1, dtype=torch.float64)], dim=1)
    rows[1] *= 2  # row 1 written by two ranks (in different epochs): its sums and its copies doubled
    got = fields_of(rows)
    assert got["rolloutLogprobAbsDiff"] == pytest.approx(sum(abs(r) for r in R) / 4)
    assert got["rolloutLogprobKL"] == pytest.approx(-sum(R) / 4)  # mean of log p_gen - log p_train
    assert got["rolloutLogprobK3"] == pytest.approx(sum(k3(r) for r in R) / 4)
    assert got["rolloutLogprobMaxDiff"] == pytest.approx(1.0)
    assert fields_of(torch.zeros(3, 6, dtype=torch.float64)) == dict.fromkeys(got)  # no policy token: None


def test_row_mismatch_overwrites_a_row_it_sees_again():
    rollout = Rollout(torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long), 2, [0, 1],
                      generation_logprobs=GEN)
    mismatch = RowMismatch()
    for _ in range(2):  # an out-of-memory redo, or a second epoch: the same rows again
        mismatch.add(rollout, torch.tensor([1]), TRAIN[1:, :2], MASK[1:, :2])
        mismatch.add(rollout, torch.tensor([0]), TRAIN[:1], MASK[:1])
    rows = mismatch.take(2)
    assert rows[:, 5].tolist() == [1.0, 1.0] and mismatch.rows is None
    assert fields_of(rows)["rolloutLogprobAbsDiff"] == pytest.approx(sum(abs(r) for r in R) / 4)
    assert mismatch.take(2).abs().sum() == 0  # nothing added since: zeros
    unrecorded = RowMismatch()  # a rollout without generation's log-probs: nothing to compare
    unrecorded.add(Rollout(rollout.sequences, rollout.attention_mask, 2, [0, 1]), torch.tensor([0]), TRAIN, MASK)
    assert unrecorded.rows is None
