"""Every record shape (standard, conversational, implicit prompt, prompt-only, unpaired) reads the
same from JSONL, Parquet and a save_to_disk Arrow directory."""

import json

import pytest

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.preferences import load_preference_data
from rlkube.runtime.data.prompts import load_prompt_data
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.data.unpaired import load_unpaired_data
from tests.unit.runtime.data_builders import write, write_arrow_dir

FORMATS = ["jsonl", "parquet", "arrow"]
TOK = ByteTokenizer()


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


STANDARD = [
    {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    {"prompt": "Sky?", "chosen": "blue", "rejected": "green"},
    {"prompt": "Cat?", "chosen": "meow", "rejected": "woof"},
]
CONVERSATIONAL = [
    {"prompt": [user("2+2?")], "chosen": [assistant("4")], "rejected": [assistant("5")]},
    {"prompt": [user("Sky?")], "chosen": [assistant("blue")], "rejected": [assistant("green")]},
    {"prompt": [user("Cat?")], "chosen": [assistant("meow")], "rejected": [assistant("woof")]},
]
IMPLICIT = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in CONVERSATIONAL]


def spec(source, fmt, **kw):
    return DataSpec.model_validate({"source": str(source), "format": fmt, "maxSeqLen": 64, **kw})


@pytest.mark.parametrize("fmt", FORMATS)
def test_standard_preferences(tmp_path, fmt):
    data = load_preference_data(spec(write(fmt, tmp_path, STANDARD), fmt), TOK, "byte", None)
    assert data.prompts == [list(r["prompt"].encode()) for r in STANDARD]
    assert data.chosen[1] == list(b"blue") and data.rejected[2] == list(b"woof")
    assert data.specials and data.chosen_mask is None and data.skipped == 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [CONVERSATIONAL, IMPLICIT], ids=["explicit-prompt", "implicit-prompt"])
def test_conversational_preferences(tmp_path, fmt, rows):
    data = load_preference_data(spec(write(fmt, tmp_path, rows), fmt), TOK, "byte", None)
    # the byte tokenizer's plain chat format; the prompt ends with the generation prompt
    assert [TOK.decode(p) for p in data.prompts] == ["user: 2+2?\nassistant: ", "user: Sky?\nassistant: ",
                                                      "user: Cat?\nassistant: "]
    assert TOK.decode(data.chosen[1]) == "blue\n" and TOK.decode(data.rejected[1]) == "green\n"
    assert data.chosen_mask[1] == [1] * 5 and data.specials


@pytest.mark.parametrize("fmt", FORMATS)
def test_prompt_only_with_answers(tmp_path, fmt):
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": [user("Sky?")], "answer": None}]
    # one dataset has one shape: the two are read from two sources
    data = load_prompt_data(spec(write(fmt, tmp_path, rows[:1]), fmt), TOK, max_new_tokens=8)
    assert data.texts == ["2+2="] and data.ids == [[TOK.bos_id, *b"2+2="]] and data.answers == ["4"]
    (tmp_path / "chat").mkdir()
    data = load_prompt_data(spec(write(fmt, tmp_path / "chat", rows[1:]), fmt), TOK, max_new_tokens=8)
    assert data.texts == ["user: Sky?\nassistant: "] and data.answers == [None]
    assert data.ids == [[TOK.bos_id, *b"user: Sky?\nassistant: "]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpaired(tmp_path, fmt):
    rows = [{"prompt": "Sky?", "completion": "blue", "label": True},
            {"prompt": "Sky?", "completion": "green", "label": False}]
    data = load_unpaired_data(spec(write(fmt, tmp_path, rows), fmt), TOK)
    assert data.labels == [True, False]
    assert data.completions == [list(b"blue"), list(b"green")] and data.masks[1] == [1] * 5
    chat = [{"prompt": [user("Sky?")], "completion": [assistant("blue")], "label": True}]
    (tmp_path / "chat").mkdir()
    data = load_unpaired_data(spec(write(fmt, tmp_path / "chat", chat), fmt), TOK)
    assert TOK.decode(data.prompts[0]) == "user: Sky?\nassistant: " and data.masks == [[1] * 5]


def test_arrow_dataset_dict_reads_its_train_split(tmp_path):
    write_arrow_dir(tmp_path / "dd" / "train", STANDARD)
    write_arrow_dir(tmp_path / "dd" / "test", STANDARD[:1], shards=1)
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert len(load_preference_data(spec(tmp_path / "dd", "arrow"), TOK, "byte", None)) == 3
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["test"]}))
    with pytest.raises(ValueError, match="without a 'train' split"):
        load_preference_data(spec(tmp_path / "dd", "arrow"), TOK, "byte", None)


def test_arrow_state_naming_a_missing_file_is_an_error(tmp_path):
    d = write_arrow_dir(tmp_path / "ds", STANDARD)
    (d / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(ValueError, match="names Arrow files that are missing"):
        load_preference_data(spec(d, "arrow"), TOK, "byte", None)


def test_field_mapping(tmp_path):
    rows = [{"question": r["prompt"], "good": r["chosen"], "bad": r["rejected"]} for r in STANDARD]
    fields = {"prompt": "question", "chosen": "good", "rejected": "bad"}
    for fmt in FORMATS:
        (tmp_path / fmt).mkdir()
        data = load_preference_data(spec(write(fmt, tmp_path / fmt, rows), fmt, fields=fields), TOK, "byte", None)
        assert data.chosen[0] == list(b"4"), fmt
    prompts = [{"q": "2+2=", "gold": 4}]
    data = load_prompt_data(spec(write("jsonl", tmp_path, prompts), "jsonl", fields={"prompt": "q", "answer": "gold"}),
                            TOK, max_new_tokens=8)
    assert data.texts == ["2+2="] and data.answers == ["4"]  # a number answer is kept as text


def test_field_mapping_names_unknown_fields_at_config_time():
    with pytest.raises(ValueError, match="fields.promt"):
        spec("x", "jsonl", fields={"promt": "q"})
