"""RL budgets: balanced micro-batches under a token budget, and the first step's calibration."""

from types import SimpleNamespace

from rlkube.runtime.contract.config import BatchingSpec
from rlkube.runtime.trainers.batching import SampleCost
from rlkube.runtime.trainers.rl.budgets import RLBudgets, balanced, split_share


def rows(*lengths):
    return [SampleCost(i, n, 1, n) for i, n in enumerate(lengths)]


def test_equal_rows_are_cut_into_equal_micro_batches():
    greedy = split_share(rows(*[100] * 64), 5800, 1, 64, packed=False)
    assert [len(b) for b in greedy] == [58, 6]
    assert [len(b) for b in balanced(greedy, 5800)] == [32, 32]


def test_balancing_never_breaks_the_budget():
    # long rows first: an equal split would put 3 rows of 100 in the first micro-batch (300 > 250)
    greedy = split_share(rows(100, 100, 60, 60, 60, 60), 250, 1, 64, packed=False)
    for b in balanced(greedy, 250):
        assert len(b) * max(c.longest for c in b) <= 250


def budgets(**kw):
    return RLBudgets(BatchingSpec(**kw), None, None)


def plan(left=40 << 30, resident=10 << 30, train_tokens=8000, forward_tokens=10**9, decode_rows=0):
    return SimpleNamespace(left=left, resident=resident, train_tokens=train_tokens, decode_rows=decode_rows,
                           forward_ratio=10.0, train_bytes_per_token=4 << 20, forward_tokens=forward_tokens,
                           grows_from_peaks=False)


def test_calibration_grows_the_budget_to_what_a_token_measurably_costs():
    b = RLBudgets(BatchingSpec(), plan(), None)
    b.largest_tokens = 8000
    # 8,000 tokens took 20 GiB beyond the resident 10: 2.56 MiB a token; 40 GiB left -> 16,000 tokens
    said = b.calibrate(30 << 30, plan())
    assert b.train_tokens == 16000 and "measured 2.56 MiB" in said
    assert b.calibrate(30 << 30, plan()) is None  # once


def test_calibration_never_shrinks_and_is_capped():
    b = RLBudgets(BatchingSpec(), plan(), None)
    b.largest_tokens = 8000
    assert b.calibrate(70 << 30, plan()) is None and b.train_tokens == 8000
    b = RLBudgets(BatchingSpec(), plan(), None)
    b.largest_tokens = 8000
    b.calibrate((10 << 30) + 8000 * 1024, plan())  # 1 KiB a token: 40 GiB would hold 40M tokens
    assert b.train_tokens == 4 * 8000


def test_fixed_mode_does_not_calibrate():
    b = RLBudgets(BatchingSpec(mode="fixed"), plan(), None)
    b.largest_tokens = 8000
    assert b.calibrate(12 << 30, plan()) is None and b.train_tokens == 8000


def test_a_rank_that_trains_nothing_scores_with_the_plans_forward_budget():
    # A reference on GPUs of its own: the plan has no training budget, only forward passes.
    from rlkube.runtime.trainers.memory_plan import GIB, HeldModel, ModelShape, PlanRequest, make_plan

    shape = ModelShape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=259)
    ref = HeldModel("reference", shape, params=107_456, trainable=0, dtype_bytes=2)
    made = make_plan(PlanRequest(capacity=8 * GIB, fraction=0.9, in_use=0, models=(ref,), row_tokens=64))
    assert made.train_tokens == 0 and made.forward_tokens > 100_000
    b = RLBudgets(BatchingSpec(mode="adaptive"), made, None)
    assert b.forward_tokens >= made.forward_tokens - 1  # not one token a micro-batch
    cut = b.micro_batches([64] * 32, [list(range(32))], 0, forward=True)
    assert [len(mb) for mb in cut] == [32]


def test_calibration_does_not_undo_an_out_of_memory_shrink():
    b = RLBudgets(BatchingSpec(), plan(), None)
    failed = rows(*[1000] * 8)  # 8,000 tokens ran out of memory in the first step
    assert b.training_oom(failed, world_size=1)
    assert b.train_tokens == 4000
    b.largest_tokens = 8000
    # a peak that, read as the cost of 8,000 tokens, would allow 16,000
    assert b.calibrate(30 << 30, plan()) is None
    assert b.train_tokens == 4000


def test_a_resumed_run_does_not_calibrate_again():
    first = RLBudgets(BatchingSpec(), plan(), None)
    first.largest_tokens = 8000
    first.calibrate(30 << 30, plan())
    first.batcher.budget = 12000  # shrunk later by a measured peak above the target
    resumed = RLBudgets(BatchingSpec(), plan(), None)
    resumed.load_state_dict(first.state_dict())
    resumed.largest_tokens = 12000
    assert resumed.calibrate((10 << 30) + 12000 * (1 << 20), plan()) is None
    assert resumed.train_tokens == 12000


def test_calibration_does_not_raise_the_forward_budget_past_the_plans():
    b = RLBudgets(BatchingSpec(), plan(forward_tokens=100_000), None)
    assert b.forward_tokens == 80_000  # 8,000 training tokens x the forward ratio 10
    b.largest_tokens = 8000
    b.calibrate(30 << 30, plan(forward_tokens=100_000))  # training budget 8,000 -> 16,000
    assert b.train_tokens == 16000 and b.forward_tokens == 100_000


def test_a_resume_on_a_smaller_card_keeps_the_budgets_within_its_plan():
    saved = RLBudgets(BatchingSpec(), plan(train_tokens=8000, decode_rows=128), None)
    saved.batcher.budget = 32000
    state = saved.state_dict()
    smaller = RLBudgets(BatchingSpec(), plan(train_tokens=2000, decode_rows=32), None)
    smaller.load_state_dict(state)
    assert smaller.train_tokens == 4 * 2000 and smaller.decode_rows == 32
    same = RLBudgets(BatchingSpec(), plan(train_tokens=8000, decode_rows=128), None)
    same.load_state_dict(state)
    assert same.train_tokens == 32000 and same.decode_rows == 128


def test_an_out_of_memory_error_on_several_ranks_leaves_the_smaller_budget_for_the_restart(tmp_path):
    """The attempt ends (the other ranks wait in collectives); the restart, from a checkpoint written
    at the larger budget, starts at the smaller one."""
    ran_out = RLBudgets(BatchingSpec(), plan(train_tokens=8000, decode_rows=128), None, memo=(str(tmp_path), 1))
    checkpoint = ran_out.state_dict()  # the last checkpoint, written before the error
    failed = [SampleCost(i, 500, 1, 500) for i in range(16)]  # 16 rows of 500 tokens: 8,000
    assert ran_out.training_oom(failed, world_size=2) is False
    assert ran_out.decode_oom(world_size=2, rows=128) is False
    restarted = RLBudgets(BatchingSpec(), plan(train_tokens=8000, decode_rows=128), None, memo=(str(tmp_path), 0))
    restarted.load_state_dict(checkpoint)
    assert restarted.train_tokens == 4000 and restarted.decode_rows == 64
    elsewhere = RLBudgets(BatchingSpec(), plan(train_tokens=8000, decode_rows=128), None, memo=(str(tmp_path / "x"), 0))
    assert elsewhere.train_tokens == 8000  # another job's directory: nothing recalled


def test_on_one_rank_the_error_is_redone_and_nothing_is_left(tmp_path):
    b = RLBudgets(BatchingSpec(), plan(train_tokens=8000), None, memo=(str(tmp_path), 0))
    assert b.training_oom([SampleCost(i, 500, 1, 500) for i in range(16)], world_size=1) is True
    assert b.train_tokens == 4000 and not (tmp_path / "oom-budgets").exists()
