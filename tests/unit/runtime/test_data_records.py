"""Malformed records: an error naming the file, line or row, and field; or, with
data.skipInvalid, skipped, logged and counted. Never dropped silently."""

import json
import logging

import pytest

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.preferences import load_preference_data
from rlkube.runtime.data.prompts import load_prompt_data
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.data.unpaired import load_unpaired_data
from tests.unit.runtime.data_builders import write_parquet

TOK = ByteTokenizer()
GOOD = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
U = {"role": "user", "content": "hi"}
A = {"role": "assistant", "content": "hello"}
B = {"role": "assistant", "content": "go away"}

# (bad record, field named, problem) — each written as line 2 after a good record
PREFERENCE_CASES = [
    ({"prompt": "x", "rejected": "y"}, "chosen", "is missing"),
    ({"prompt": "x", "chosen": 3, "rejected": "y"}, "chosen", "must be a string"),
    ({"prompt": "x", "chosen": "a", "rejected": "  "}, "rejected", "is empty"),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, "prompt", "is empty"),
    ({"chosen": "a", "rejected": "b"}, "prompt", "is missing"),
    ({"prompt": "x", "chosen": "a", "rejected": [B]}, "rejected", "must be a string like 'chosen'"),
]
CHAT_CASES = [
    ({"prompt": [U], "chosen": [A], "rejected": [{"role": "assistant"}]}, "rejected[0].content", "must be a string"),
    ({"prompt": [U], "chosen": [A], "rejected": [{"role": "assistant", "content": ""}]}, "rejected[0].content",
     "is empty"),
    ({"prompt": [U], "chosen": [], "rejected": [B]}, "chosen", "is an empty list"),
    ({"prompt": [U], "chosen": [A, U], "rejected": [B]}, "chosen", "must end with an assistant message"),
    ({"chosen": [U, A], "rejected": [{"role": "user", "content": "other"}, B]}, "prompt", "share no opening"),
    ({"prompt": "hi", "chosen": [A], "rejected": [B]}, "prompt", "must be messages like 'chosen'"),
    ({"prompt": [U], "chosen": [{"role": "assistant", "content": "x" * 80}], "rejected": [B]}, "chosen",
     "longer than data.maxSeqLen=64"),
]


def spec(source, **kw):
    fmt = "parquet" if str(source).endswith(".parquet") else "jsonl"
    return DataSpec.model_validate({"source": str(source), "format": fmt, "maxSeqLen": 64, **kw})


def jsonl(tmp_path, first, bad, name="bad.jsonl"):
    f = tmp_path / name
    f.write_text(json.dumps(first) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n")
    return f


@pytest.mark.parametrize(("bad", "field", "problem"), PREFERENCE_CASES, ids=lambda v: str(v)[:30])
def test_standard_record_errors_name_file_line_and_field(tmp_path, bad, field, problem):
    f = jsonl(tmp_path, GOOD, bad)
    with pytest.raises(ValueError) as e:
        load_preference_data(spec(f), TOK, "byte", None)
    assert str(e.value).startswith(f"data.source: {f}:2: field '{field}' "), str(e.value)
    assert problem in str(e.value)


@pytest.mark.parametrize(("bad", "field", "problem"), CHAT_CASES, ids=lambda v: str(v)[:30])
def test_conversational_record_errors_name_file_line_and_field(tmp_path, bad, field, problem):
    f = jsonl(tmp_path, {"prompt": [U], "chosen": [A], "rejected": [B]}, bad)
    with pytest.raises(ValueError) as e:
        load_preference_data(spec(f), TOK, "byte", None)
    assert str(e.value).startswith(f"data.source: {f}:2: field '{field}' "), str(e.value)
    assert problem in str(e.value)


def test_not_json_names_the_line(tmp_path):
    f = jsonl(tmp_path, GOOD, "{not json")
    with pytest.raises(ValueError, match=rf"data.source: {f}:2: not JSON"):
        load_preference_data(spec(f), TOK, "byte", None)


def test_mapped_field_names_its_column(tmp_path):
    f = jsonl(tmp_path, {"q": "x", "good": "a", "bad": "b"}, {"q": "x", "good": 7, "bad": "b"})
    with pytest.raises(ValueError, match=rf"{f}:2: field 'chosen' \(column 'good'\) must be a string"):
        load_preference_data(spec(f, fields={"prompt": "q", "chosen": "good", "rejected": "bad"}), TOK, "byte", None)


def test_parquet_errors_name_the_row_and_missing_columns(tmp_path):
    f = write_parquet(tmp_path / "p.parquet", [GOOD, {"prompt": "x", "chosen": None, "rejected": "y"}])
    with pytest.raises(ValueError, match=rf"data.source: {f} row 1: field 'chosen' is missing"):
        load_preference_data(spec(f), TOK, "byte", None)
    g = write_parquet(tmp_path / "q.parquet", [{"prompt": "x", "good": "a", "rejected": "b"}])
    with pytest.raises(ValueError, match=rf"data.source: {g}: no column 'chosen' \(columns: prompt, good, rejected\)"):
        load_preference_data(spec(g), TOK, "byte", None)


def test_skip_invalid_skips_logs_and_counts(tmp_path, caplog):
    lines = [GOOD, {"prompt": "x"}, "{oops", GOOD, {"prompt": "x", "chosen": "", "rejected": "y"}]
    f = tmp_path / "mixed.jsonl"
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in lines))
    with pytest.raises(ValueError, match=":2: field 'chosen' is missing"):
        load_preference_data(spec(f), TOK, "byte", None)
    caplog.set_level(logging.WARNING, logger="rlkube.runtime")
    out = tmp_path / "out"
    data = load_preference_data(spec(f, skipInvalid=True), TOK, "byte", str(out))
    assert len(data) == 2 and data.skipped == 3
    logged = caplog.text
    assert f"{f}:2: field 'chosen' is missing" in logged and f"{f}:3: not JSON" in logged
    assert f"{f}:5: field 'chosen' is empty" in logged and "skipped 3 invalid record(s) of 5" in logged
    # the count survives the cache, and is logged again when the cache is used
    caplog.clear()
    again = load_preference_data(spec(f, skipInvalid=True), TOK, "byte", str(out))
    assert again.skipped == 3 and len(again) == 2 and "3 invalid record(s) were skipped" in caplog.text


def test_all_invalid_is_an_error_even_when_skipping(tmp_path):
    f = jsonl(tmp_path, {"prompt": "x"}, {"prompt": "y"})
    with pytest.raises(ValueError, match=r"no preference pairs found \(2 invalid, all skipped\)"):
        load_preference_data(spec(f, skipInvalid=True), TOK, "byte", None)


def test_one_dataset_has_one_shape(tmp_path):
    f = jsonl(tmp_path, GOOD, {"prompt": [U], "chosen": [A], "rejected": [B]})
    with pytest.raises(ValueError, match=r":2: field 'chosen' makes this record conversational, but the data's "
                       "first record is standard"):
        load_preference_data(spec(f), TOK, "byte", None)


def test_prompt_records(tmp_path):
    f = jsonl(tmp_path, {"prompt": "a"}, {"prompt": "b", "answer": [1]})
    with pytest.raises(ValueError, match=rf"{f}:2: field 'answer' must be a string or a number, got list"):
        load_prompt_data(spec(f), TOK, max_new_tokens=8)
    long = {"prompt": [{"role": "user", "content": "x" * 80}]}
    g = jsonl(tmp_path, {"prompt": [U]}, long, name="long.jsonl")
    with pytest.raises(ValueError, match=rf"{g}:2: field 'prompt' is \d+ tokens, more than data.maxSeqLen=64"):
        load_prompt_data(spec(g), TOK, max_new_tokens=8)
    data = load_prompt_data(spec(g, skipInvalid=True), TOK, max_new_tokens=8)
    assert len(data) == 1 and data.skipped == 1
    # a long string prompt is still cut from the left, as before
    h = jsonl(tmp_path, {"prompt": "a"}, {"prompt": "y" * 100}, name="cut.jsonl")
    assert len(load_prompt_data(spec(h), TOK, max_new_tokens=8).ids[1]) == 64 - 8


def test_unpaired_records(tmp_path):
    f = jsonl(tmp_path, {"prompt": "a", "completion": "b", "label": True}, {"prompt": "a", "completion": "b", "label": 1})
    with pytest.raises(ValueError, match=rf"{f}:2: field 'label' must be true or false, got int"):
        load_unpaired_data(spec(f), TOK)
    data = load_unpaired_data(spec(f, skipInvalid=True), TOK)
    assert data.labels == [True] and data.skipped == 1
