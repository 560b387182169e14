"""Conversations are rendered with the tokenizer's chat template and score the assistant's turns
only: checked token by token with a real (small, trained-here) Hugging Face tokenizer and with
the byte tokenizer, down to the targets of a packed batch."""

import pytest

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.chat import render_chat
from rlkube.runtime.data.packing import pack_pairs, pad_pairs
from rlkube.runtime.data.preferences import load_preference_data
from rlkube.runtime.data.prompts import load_prompt_data
from rlkube.runtime.data.tokenizer import ByteTokenizer, load_tokenizer
from tests.unit.runtime.data_builders import build_hf_tokenizer, write_jsonl

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK = {"role": "user", "content": "What is the capital of France?"}
GOOD = {"role": "assistant", "content": "The capital of France is Paris."}
BAD = {"role": "assistant", "content": "The sky is blue."}
MORE = {"role": "user", "content": "And a spider?"}
LEGS = {"role": "assistant", "content": "A spider has eight legs."}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return load_tokenizer(build_hf_tokenizer(tmp_path_factory.mktemp("tok")))


def scored_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask, strict=True) if m])


def test_hf_tokenizer_loads_with_its_specials_and_template(hf):
    assert hf.chat_renders_specials and hf._tok.padding_side == "left"
    assert hf._tok.convert_ids_to_tokens([hf.bos_id, hf.eos_id, hf.pad_id]) == ["<s>", "<|im_end|>", "<pad>"]
    assert hf.chat_text([ASK], add_generation_prompt=True) == (
        "<s><|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_single_turn_mask_token_by_token(hf):
    r = render_chat(hf, [SYSTEM, ASK], [GOOD])
    # the prompt is exactly the template with its generation prompt, specials included
    assert r.prompt == hf.encode(hf.chat_text([SYSTEM, ASK], add_generation_prompt=True))
    assert r.prompt[0] == hf.bos_id
    # every completion token is the assistant's: content, <|im_end|>, the template's newline
    expected = hf.encode("The capital of France is Paris.") + [hf.eos_id] + hf.encode("\n")
    assert r.completion == expected
    assert r.mask == [1] * len(expected)
    # prompt + completion is the whole conversation as the template renders it
    assert r.prompt + r.completion == hf.encode(hf.chat_text([SYSTEM, ASK, GOOD], add_generation_prompt=False))


def test_multi_turn_completion_masks_the_user_turn_and_headers(hf):
    r = render_chat(hf, [ASK], [GOOD, MORE, LEGS])
    turn1 = hf.encode("The capital of France is Paris.") + [hf.eos_id] + hf.encode("\n")
    user2 = hf.encode("<|im_start|>user\nAnd a spider?<|im_end|>\n")
    header = hf.encode("<|im_start|>assistant\n")
    turn2 = hf.encode("A spider has eight legs.") + [hf.eos_id] + hf.encode("\n")
    assert r.completion == turn1 + user2 + header + turn2
    assert r.mask == [1] * len(turn1) + [0] * len(user2) + [0] * len(header) + [1] * len(turn2)
    assert scored_text(hf, r.completion, r.mask) == (
        "The capital of France is Paris.<|im_end|>\nA spider has eight legs.<|im_end|>\n"
    )


def test_byte_tokenizer_mask_token_by_token():
    tok = ByteTokenizer()
    r = render_chat(tok, [ASK], [GOOD, MORE, LEGS])
    assert tok.decode(r.prompt) == "user: What is the capital of France?\nassistant: "
    text = tok.decode(r.completion)
    assert text == "The capital of France is Paris.\nuser: And a spider?\nassistant: A spider has eight legs.\n"
    scored = "".join(ch for ch, m in zip(text, r.mask, strict=True) if m)
    assert scored == "The capital of France is Paris.\nA spider has eight legs.\n"


@pytest.mark.parametrize("kind", ["hf", "byte"])
def test_packed_targets_are_the_assistant_tokens(tmp_path, hf, kind):
    tok = hf if kind == "hf" else ByteTokenizer()
    f = write_jsonl(tmp_path / "chat.jsonl", [
        {"chosen": [SYSTEM, ASK, GOOD, MORE, LEGS], "rejected": [SYSTEM, ASK, GOOD, MORE, BAD]},
    ])
    spec = DataSpec.model_validate({"source": str(f), "maxSeqLen": 256})
    data = load_preference_data(spec, tok, kind, None)
    # implicit prompt: the shared turns up to the last user message
    assert data.specials == (kind == "byte")
    rendered = render_chat(tok, [SYSTEM, ASK, GOOD, MORE], [LEGS])
    assert data.prompts[0] == rendered.prompt and data.chosen[0] == rendered.completion
    for batch in (pack_pairs(data, [0], tok.bos_id, tok.eos_id), pad_pairs(data, [0], tok.bos_id, tok.eos_id, tok.pad_id)):
        chosen = batch.target_ids[batch.target_seq == 0].tolist()
        want = rendered.completion + ([tok.eos_id] if kind == "byte" else [])
        assert chosen == want
        # each target is the token right after its index in the flattened rows
        flat = batch.input_ids.flatten()
        assert flat[batch.target_index + 1].tolist() == batch.target_ids.tolist()
        assert batch.response_tokens.tolist() == [len(want), float((batch.target_seq == 1).sum())]


def test_masked_tokens_are_not_targets():
    tok = ByteTokenizer()
    f_rows = [{"prompt": [ASK], "chosen": [GOOD, MORE, LEGS], "rejected": [BAD]}]
    from rlkube.runtime.data.preferences import tokenise_records
    from rlkube.runtime.data.records import InvalidRecords
    from rlkube.runtime.data.sources import RawRecord

    spec = DataSpec.model_validate({"source": "x", "maxSeqLen": 512})
    data = tokenise_records([RawRecord("x:1", r) for r in f_rows], spec, tok, InvalidRecords(False))
    b = pack_pairs(data, [0], tok.bos_id, tok.eos_id)
    chosen = b.target_ids[b.target_seq == 0].tolist()
    assert tok.decode(chosen) == "The capital of France is Paris.\nA spider has eight legs.\n"
    assert chosen[-1] == tok.eos_id  # the wrapped eos is scored: the model learns to stop
    assert b.response_tokens[0] == len(chosen)


def test_conversational_prompts_for_generation(tmp_path, hf):
    f = write_jsonl(tmp_path / "p.jsonl", [{"prompt": [SYSTEM, ASK], "answer": "Paris"}])
    spec = DataSpec.model_validate({"source": str(f), "maxSeqLen": 128})
    data = load_prompt_data(spec, hf, max_new_tokens=16)
    assert data.texts[0].endswith("<|im_start|>assistant\n") and data.answers == ["Paris"]
    assert data.ids[0] == hf.encode(data.texts[0]) and data.ids[0].count(hf.bos_id) == 1


def test_a_tokenizer_without_chat_template_is_named(tmp_path):
    from transformers import AutoTokenizer

    path = build_hf_tokenizer(tmp_path / "tok")
    t = AutoTokenizer.from_pretrained(path)
    t.chat_template = None
    t.save_pretrained(tmp_path / "plain")
    (tmp_path / "plain" / "chat_template.jinja").unlink(missing_ok=True)
    tok = load_tokenizer(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="model.tokenizer: .* has no chat template"):
        render_chat(tok, [ASK], [GOOD])
