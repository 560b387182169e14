"""Data order: deterministic per step, epochs cover the data, length bucketing cuts padding."""

import random

import pytest

from rlkube.runtime.data.bucketing import bucketed_batches, padding_fraction
from rlkube.runtime.data.sampler import StepSampler
from rlkube.runtime.data.synthetic import sample_lengths, synthetic_pairs


def test_order_is_a_function_of_seed_and_step():
    a, b = StepSampler(100, 8, seed=3), StepSampler(100, 8, seed=3)
    assert [a.batch(s) for s in range(30)] == [b.batch(s) for s in reversed(range(30))][::-1]
    assert StepSampler(100, 8, seed=4).batch(0) != a.batch(0)


def test_an_epoch_uses_each_sample_at_most_once():
    s = StepSampler(100, 8, seed=0)
    seen = [i for step in range(s.steps_per_epoch) for i in s.batch(step)]
    assert len(seen) == len(set(seen)) == 96
    assert s.batch(s.steps_per_epoch) != s.batch(0)  # a new epoch reshuffles


def test_too_few_samples_names_the_field():
    with pytest.raises(ValueError, match="batching.globalBatch"):
        StepSampler(4, 8, seed=0)


def test_bucketing_reduces_padding_and_keeps_samples():
    lengths = sample_lengths(2048, 4096, "longTailed", seed=1)
    rng = random.Random(0)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    plain = [order[s : s + 16] for s in range(0, 2048, 16)]
    bucketed = bucketed_batches(order, lengths, 16, random.Random(0))
    assert sorted(i for b in bucketed for i in b) == list(range(2048))
    as_lengths = lambda batches: [[lengths[i] for i in b] for b in batches]  # noqa: E731
    assert padding_fraction(as_lengths(bucketed)) < 0.2 < padding_fraction(as_lengths(plain))
    s = StepSampler(2048, 16, seed=0, lengths=lengths)
    assert s.steps_per_epoch == len(bucketed_batches(order, lengths, 16, random.Random(0)))


def test_long_tailed_lengths_have_the_agreed_shape():
    lengths = sorted(sample_lengths(20000, 8192, "longTailed", seed=0))
    median = lengths[len(lengths) // 2]
    assert 270 <= median <= 330
    assert sum(n > 2000 for n in lengths) / len(lengths) > 0.02
    assert max(sample_lengths(1000, 512, "longTailed", seed=0)) <= 512
    assert set(sample_lengths(10, 128, "fixed", seed=0)) == {128}


def test_synthetic_pairs_are_seeded_and_fit():
    a = synthetic_pairs(20, 64, "fixed", seed=7)
    assert a == synthetic_pairs(20, 64, "fixed", seed=7)
    for p in a:
        assert len(p.prompt) + len(p.chosen) + 2 == 64 and len(p.rejected) == len(p.chosen)
        period_text = p.prompt + p.chosen
        assert p.chosen != p.rejected and period_text  # chosen continues the pattern
