"""Preference files (JSONL, Parquet) are read, fitted to maxSeqLen, cached; errors say where."""

import json

import pytest

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.preferences import fit_to_length, load_preference_data
from rlkube.runtime.data.tokenizer import ByteTokenizer

ROWS = [
    {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    {"prompt": "a long prompt " * 10, "chosen": "yes", "rejected": "no thanks"},
]


def spec(source, fmt, **kw):
    return DataSpec.model_validate({"source": str(source), "format": fmt, "maxSeqLen": 32, **kw})


def test_jsonl_is_tokenised_fitted_and_cached(tmp_path):
    f = tmp_path / "prefs.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    tok = ByteTokenizer()
    data = load_preference_data(spec(f, "jsonl"), tok, "byte", str(tmp_path / "out"))
    assert len(data) == 2
    assert data.prompts[0] == list(b"2+2=") and data.chosen[0] == list(b"4")
    # the long prompt is cut from the left so the longer response and bos/eos fit in 32
    assert max(data.seq_lengths(1)) == 32 and data.prompts[1][-1] == ord(" ")
    cached = list((tmp_path / "out" / "cache").glob("preference-*.pt"))
    assert len(cached) == 1
    again = load_preference_data(spec(f, "jsonl"), tok, "byte", str(tmp_path / "out"))
    assert again.prompts == data.prompts


def test_parquet_directory(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "dir"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(ROWS), d / "a.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[:1]), d / "b.parquet")
    data = load_preference_data(spec(d, "parquet"), ByteTokenizer(), "byte", None)
    assert len(data) == 3


def test_errors_name_the_file_and_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": "x", "chosen": 3, "rejected": "y"}) + "\n")
    with pytest.raises(ValueError, match=r"data.source: .*bad.jsonl:2: field 'chosen' must be a string"):
        load_preference_data(spec(f, "jsonl"), ByteTokenizer(), "byte", None)
    with pytest.raises(ValueError, match="does not exist"):
        load_preference_data(spec(tmp_path / "nope.jsonl", "jsonl"), ByteTokenizer(), "byte", None)


def test_fit_to_length_keeps_the_end_of_the_prompt():
    assert fit_to_length(list(range(10)), [100, 101], 8) == ([6, 7, 8, 9], [100, 101])
    prompt, response = fit_to_length([1, 2], list(range(20)), 8)
    assert len(prompt) + len(response) == 6 and len(prompt) == 1
