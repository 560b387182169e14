"""The eval set: held out deterministically by seed, read from data.eval in the format its path
says, dealt to ranks in the same number of micro-batches; when a run evaluates, and what
/progress shows of an evaluation."""

from __future__ import annotations

import pytest

from rlkube.runtime.contract.config import DataSpec, RuntimeConfig
from rlkube.runtime.data.eval_split import (
    eval_format,
    eval_micro_batches,
    holdout_indices,
    split_eval,
    subset,
)
from rlkube.runtime.data.prompts import PromptData
from rlkube.runtime.infra.errors import DataError
from rlkube.runtime.trainers.evaluation import eval_due, eval_progress, preference_summary


@pytest.mark.parametrize("n, fraction, held", [(100, 0.1, 10), (10, 0.01, 1), (3, 0.9, 2), (2, 0.5, 1)])
def test_holdout_is_disjoint_complete_and_fixed_by_the_seed(n, fraction, held):
    train, evals = holdout_indices(n, fraction, seed=3)
    assert len(evals) == held and sorted(train + evals) == list(range(n))
    assert holdout_indices(n, fraction, seed=3) == (train, evals)
    if n >= 10:
        assert holdout_indices(n, fraction, seed=4)[1] != evals


def test_holdout_needs_two_samples():
    with pytest.raises(DataError, match="data.evalFraction"):
        holdout_indices(1, 0.5, 0)


def test_split_eval_holds_out_from_the_data_or_reads_the_eval_file():
    data = PromptData(texts=[f"p{i}" for i in range(8)], ids=[[i] for i in range(8)], answers=[None] * 8, skipped=2)
    train, held = split_eval(DataSpec(source="s", format="synthetic", eval_fraction=0.25), data, lambda s: None)
    assert len(train) == 6 and len(held) == 2 and train.skipped == held.skipped == 2
    assert sorted(train.texts + held.texts) == sorted(data.texts)
    assert [t.removeprefix("p") for t in held.texts] == [str(i[0]) for i in held.ids]  # fields stay aligned
    assert split_eval(DataSpec(source="s", format="synthetic"), data, lambda s: None) == (data, None)
    assert subset(data, [3, 1]).texts == ["p3", "p1"]


def test_eval_file_errors_name_data_eval(tmp_path):
    spec = DataSpec(source="s", format="synthetic", eval=str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="data.eval: .*does not exist"):
        split_eval(spec, [], lambda s: None)
    (tmp_path / "e.jsonl").write_text("")

    def load(s: DataSpec):
        assert s.source == str(tmp_path / "e.jsonl") and s.format == "jsonl" and s.eval is None
        raise DataError(f"data.source: {s.source}:1: bad")

    with pytest.raises(DataError, match=r"^data.eval: .*e.jsonl:1: bad"):
        split_eval(spec.model_copy(update={"eval": str(tmp_path / "e.jsonl")}), [], load)


def test_eval_format_from_the_path(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "arrow").mkdir()
    (tmp_path / "arrow" / "state.json").write_text("{}")
    (tmp_path / "jsonls").mkdir()
    (tmp_path / "jsonls" / "x.jsonl").write_text("")
    assert eval_format(str(tmp_path / "a.parquet"), "jsonl") == "parquet"
    assert eval_format(str(tmp_path / "arrow"), "jsonl") == "arrow"
    assert eval_format(str(tmp_path / "jsonls"), "parquet") == "jsonl"
    assert eval_format(str(tmp_path / "b.txt"), "parquet") == "parquet"
    with pytest.raises(DataError, match="data.eval: cannot tell the format"):
        eval_format(str(tmp_path / "b.txt"), "synthetic")


@pytest.mark.parametrize("n, world, micro", [(10, 3, 2), (1, 4, 8), (7, 2, 64), (12, 4, 3)])
def test_every_rank_runs_the_same_number_of_eval_micro_batches(n, world, micro):
    plans = [eval_micro_batches(n, world, rank, micro) for rank in range(world)]
    assert len({len(p) for p in plans}) == 1
    dealt = sorted(i for p in plans for mb in p for i in mb)
    assert dealt == list(range(n)) and all(len(mb) <= micro for p in plans for mb in p)


def test_eval_and_eval_fraction_exclude_each_other():
    with pytest.raises(ValueError, match="eval: set eval or evalFraction, not both"):
        DataSpec(source="s", eval="/e.jsonl", eval_fraction=0.1)


def _config(**data) -> RuntimeConfig:
    return RuntimeConfig.model_validate({
        "algorithm": "dpo", "model": {"config": {"model_type": "qwen2"}}, "roles": {"actor": {"gpus": 1}},
        "data": {"source": "s", "format": "synthetic", **data}, "training": {"steps": 10, "evalEverySteps": 4}})


def test_eval_is_due_every_n_steps_and_after_the_last():
    cfg = _config(evalFraction=0.1)
    assert [n for n in range(1, 11) if eval_due(cfg, n)] == [4, 8, 10]
    assert not any(eval_due(_config(), n) for n in range(1, 11))  # no eval set: never (and a warning)


def test_progress_fields_of_an_evaluation():
    ev = {"step": 8, "samples": 4, **preference_summary(
        {"pairs": 4.0, "loss": 2.0, "margin": 1.0, "correct": 3.0, "chosen": 0.4})}
    assert eval_progress(ev) == {"evalStep": 8, "evalLoss": 0.5, "evalAccuracy": 0.75, "evalMargin": 0.25,
                                 "evalRewardMean": 0.1}
    assert eval_progress({"step": 2, "rewardMean": -0.5}) == {"evalStep": 2, "evalRewardMean": -0.5}
