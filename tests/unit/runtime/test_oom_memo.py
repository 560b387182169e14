"""What a rank that ran out of memory leaves for the restart: the smallest budget over the ranks."""

from rlkube.runtime.trainers.oom_memo import MEMO_DIR, recalled, remember


def test_the_smallest_budget_over_the_ranks_is_recalled(tmp_path):
    assert recalled(tmp_path) == {}
    remember(tmp_path, 0, {"tokenBudget": 8000, "decodeRows": 64})
    remember(tmp_path, 1, {"tokenBudget": 4000, "forwardScale": 0.5})
    assert recalled(tmp_path) == {"tokenBudget": 4000, "decodeRows": 64, "forwardScale": 0.5}
    remember(tmp_path, 1, {"tokenBudget": 2000})  # the same rank again: its newer memo replaces it
    assert recalled(tmp_path)["tokenBudget"] == 2000


def test_an_unreadable_memo_is_skipped(tmp_path):
    remember(tmp_path, 0, {"tokenBudget": 8000})
    (tmp_path / MEMO_DIR / "rank-1.json").write_text("{not json")
    (tmp_path / MEMO_DIR / "rank-2.json").write_text('{"tokenBudget": true, "decodeRows": "x"}')
    assert recalled(tmp_path) == {"tokenBudget": 8000}
