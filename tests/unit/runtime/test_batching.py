"""AdaptiveBatcher decisions with injected measurements; rank shares; global batch kept."""

import pytest

from rlkube.runtime.contract.config import BatchingSpec
from rlkube.runtime.trainers.batching import (
    OOM_HOLD_STEPS,
    WINDOW,
    AdaptiveBatcher,
    Measurement,
    SampleCost,
    micro_batch_cost,
    rank_shares,
    split_share,
)


def costs(lengths):
    return [SampleCost(index=i, tokens=2 * n, rows=2, longest=n) for i, n in enumerate(lengths)]


def spec(**kw):
    base = dict(globalBatch=16, mode="adaptive", maxTokensPerGpu=1000, minMicroBatch=1, maxMicroBatch=64)
    base.update(kw)
    return BatchingSpec.model_validate(base)


def flat(plan):
    return sorted(c.index for mb in plan for c in mb)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_world_size_change_keeps_the_global_batch(world):
    lengths = [50, 300, 20, 700, 120, 90, 33, 410, 80, 60, 15, 250, 500, 40, 10, 200]
    plans = AdaptiveBatcher(spec(), packed=True).plan(costs(lengths), world)
    assert len(plans) == world
    every = sorted(i for p in plans for i in flat(p))
    assert every == list(range(16))  # each sample exactly once, whatever the world size
    assert len({len(p) for p in plans}) == 1  # same number of micro-batches on every rank


def test_packed_micro_batches_respect_the_budget():
    lengths = [100, 200, 50, 400, 120, 30, 30, 30]
    plan = AdaptiveBatcher(spec(maxTokensPerGpu=500), packed=True).plan(costs(lengths), 1)[0]
    for mb in plan:
        assert micro_batch_cost(mb, True) <= 500 or len(mb) == 1
    assert flat(plan) == list(range(8))


def test_sample_larger_than_budget_gets_its_own_micro_batch():
    plan = split_share(costs([1000, 10, 10]), budget=100, min_mb=1, max_mb=8, packed=True)
    assert [len(mb) for mb in plan] == [1, 2]


def test_padded_micro_batches_group_similar_lengths():
    lengths = [10, 500, 12, 480, 11, 490]
    plan = split_share(costs(lengths), budget=2000, min_mb=1, max_mb=8, packed=False)
    for mb in plan:
        assert micro_batch_cost(mb, False) <= 2000
    groups = [sorted(c.longest for c in mb) for mb in plan]
    assert [10, 11, 12] in groups  # the short ones together, not padded to 500


def test_max_micro_batch_bounds_samples():
    plan = split_share(costs([1] * 10), budget=10**9, min_mb=1, max_mb=3, packed=True)
    assert max(len(mb) for mb in plan) == 3 and sum(len(mb) for mb in plan) == 10


def test_ranks_with_fewer_samples_than_micro_batches_get_empty_ones():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=64, globalBatch=3), packed=True)
    plans = b.plan(costs([100, 100, 100]), 2)
    assert [len(p) for p in plans] == [2, 2]
    assert sorted(len(mb) for mb in plans[1]) == [0, 1]


def test_rank_shares_balance_tokens():
    shares = rank_shares(costs([1000, 10, 10, 10, 990, 20]), 2)
    loads = [sum(c.tokens for c in s) for s in shares]
    assert abs(loads[0] - loads[1]) <= 40


def test_oom_halves_the_failed_cost_and_holds_growth():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=4000), packed=True)
    failed = costs([300, 300, 300])  # 1800 tokens
    assert b.on_oom(failed) is True
    assert b.budget == 900 and b.hold == OOM_HOLD_STEPS
    plan = b.plan(costs([300] * 6), 1)[0]
    assert all(micro_batch_cost(mb, True) <= 900 for mb in plan)
    # with headroom, growth is held back after an OOM
    for _ in range(WINDOW):
        assert b.observe(Measurement(0.2, 0.5)) is None
    assert b.budget == 900


def test_oom_on_a_single_sample_cannot_shrink():
    b = AdaptiveBatcher(spec(), packed=True)
    assert b.on_oom(costs([500])) is False


def test_fixed_mode_uses_max_micro_batch_and_oom_halves_it():
    b = AdaptiveBatcher(spec(mode="fixed", maxMicroBatch=4, maxTokensPerGpu=64), packed=True)
    plan = b.plan(costs([100] * 8), 1)[0]
    assert [len(mb) for mb in plan] == [4, 4]  # budget ignored in fixed mode
    assert b.on_oom(plan[0])
    assert [len(mb) for mb in b.plan(costs([100] * 8), 1)[0]] == [2, 2, 2, 2]
    for _ in range(3 * WINDOW):  # nothing adapts in fixed mode
        assert b.observe(Measurement(0.1, 0.1)) is None


def test_grows_with_headroom_after_a_full_window():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.9), packed=True)
    for _ in range(WINDOW - 1):
        assert b.observe(Measurement(0.3, 0.95)) is None
    msg = b.observe(Measurement(0.3, 0.95))
    assert msg and b.budget == 1250  # high utilization: modest 1.25x growth
    assert len(b.window) == 0  # decisions are based on steps at the current budget


def test_grows_faster_when_gpu_is_underused():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.9), packed=True)
    for _ in range(WINDOW):
        b.observe(Measurement(0.3, 0.5))
    assert b.budget == 2000


def test_shrinks_when_peak_exceeds_target_and_caps_growth():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.8), packed=True)
    for _ in range(WINDOW):
        b.observe(Measurement(0.95, 0.99))
    assert b.budget == int(1000 * 0.8 / 0.95 * 0.95)
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000), packed=True)
    for _ in range(20 * WINDOW):
        b.observe(Measurement(0.01, 0.1))
    assert b.budget == 8000  # MAX_GROWTH x maxTokensPerGpu


def test_no_measurements_no_change():
    b = AdaptiveBatcher(spec(), packed=True)
    for _ in range(2 * WINDOW):
        assert b.observe(Measurement(None, None)) is None
    assert b.budget == 1000


def test_state_round_trip():
    b = AdaptiveBatcher(spec(), packed=True)
    b.on_oom(costs([300, 300]))
    c = AdaptiveBatcher(spec(), packed=True)
    c.load_state_dict(b.state_dict())
    assert (c.budget, c.hold, c.max_mb) == (b.budget, b.hold, b.max_mb)


def test_busy_of_a_window_is_the_step_time_weighted_mean():
    from rlkube.runtime.trainers.batching import window_busy

    steps = [Measurement(0.3, 0.9, seconds=1.0), Measurement(0.3, 0.5, seconds=3.0), Measurement(0.3, None, 2.0)]
    assert window_busy(steps) == pytest.approx((0.9 * 1 + 0.5 * 3) / 4)
    assert window_busy([Measurement(0.3, 0.2), Measurement(0.3, 0.6)]) == pytest.approx(0.4)  # no times: equal
    assert window_busy([Measurement(0.3, None, 1.0)]) is None


def test_one_short_idle_step_does_not_make_the_batcher_grow_fast():
    # the case: a read of 4% on one step while the window was busy; the min of per-step
    # values would double the budget, the time-weighted mean keeps the modest growth
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.9), packed=True)
    for _ in range(WINDOW - 1):
        assert b.observe(Measurement(0.3, 0.95, seconds=1.0)) is None
    msg = b.observe(Measurement(0.3, 0.04, seconds=0.1))
    assert b.budget == 1250 and "GPU utilization 94%" in msg


def test_a_long_underused_step_in_the_window_makes_it_grow_fast():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.9), packed=True)
    b.observe(Measurement(0.3, 0.3, seconds=8.0))
    for _ in range(WINDOW - 1):
        b.observe(Measurement(0.3, 0.95, seconds=1.0))
    assert b.budget == 2000  # (0.3 x 8 + 0.95 x 7) / 15 = 0.60 busy: 2x


def test_memory_over_target_shrinks_whatever_the_busy_fraction():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.8), packed=True)
    for k in range(WINDOW):
        b.observe(Measurement(0.5 if k else 0.96, 0.1, seconds=1.0))
    assert b.budget == int(1000 * 0.8 / 0.96 * 0.95)


def test_steps_without_busy_samples_still_adapt_on_memory():
    b = AdaptiveBatcher(spec(maxTokensPerGpu=1000, memoryFraction=0.9), packed=True)
    for _ in range(WINDOW):
        b.observe(Measurement(0.3, None, seconds=1.0))
    assert b.budget == 1250  # no busy fraction: the modest growth, never the fast one
