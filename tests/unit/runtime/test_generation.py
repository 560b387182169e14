"""Generation: greedy equals a naive no-cache loop, EOS stops rows, mixed prompt lengths, sampling."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.engine.generation import Decoder, SamplingParams, generate, sample_tokens

torch.set_num_threads(1)
VOCAB, PAD = 64, 0


def tiny_model(model_type="qwen2", attn="sdpa", seed=0):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def naive_greedy(model, prompt, steps, eos=None):
    """Full forward over the unpadded sequence for every new token: no cache, no padding."""
    seq = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            seq.append(token)
            if token == eos:
                break
    return out


PROMPTS = [[5, 9, 3, 17, 22, 8, 1], [40, 2], [7, 7, 30, 11]]


@pytest.mark.parametrize("model_type,attn,static", [
    ("qwen2", "sdpa", False), ("qwen2", "sdpa", True), ("llama", "eager", False), ("llama", "sdpa", True),
])
def test_greedy_matches_naive_loop_with_mixed_prompt_lengths(model_type, attn, static):
    model = tiny_model(model_type, attn)
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, pad_token_id=PAD)
    out = generate(model, ids, mask, params, static_cache=static)
    for row, prompt in enumerate(PROMPTS):
        assert out.response_ids[row].tolist() == naive_greedy(model, prompt, 12), (row, model_type, attn)
    assert out.response_mask.sum() == 3 * 12
    assert out.sequences.shape == (3, 7 + 12)


def test_eos_stops_each_row_and_pads_after_it():
    model = tiny_model()
    ids, mask = left_padded(PROMPTS)
    free = [naive_greedy(model, p, 16) for p in PROMPTS]
    eos = free[1][3]  # a token row 1 emits at step 3 (it may appear earlier in other rows too)
    params = SamplingParams(max_new_tokens=16, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    out = generate(model, ids, mask, params)
    for row, prompt in enumerate(PROMPTS):
        want = naive_greedy(model, prompt, 16, eos=eos)
        got = out.response_ids[row].tolist()
        n = len(want)
        assert got[:n] == want
        assert all(t == PAD for t in got[n:])
        assert out.response_mask[row].tolist() == [1] * n + [0] * (len(got) - n)
    assert int(out.response_lengths[1]) <= 4


def test_all_rows_finishing_ends_the_loop_early():
    model = tiny_model()
    ids, mask = left_padded([[3, 4], [3, 4]])
    first = naive_greedy(model, [3, 4], 1)[0]
    out = generate(model, ids, mask, SamplingParams(max_new_tokens=64, temperature=0.0, eos_token_id=first))
    assert out.response_ids.shape[1] < 64 and out.response_mask.sum() == 2


def test_right_padded_prompts_are_rejected():
    model = tiny_model()
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, torch.tensor([[1, 2, 0]]), torch.tensor([[1, 1, 0]]), SamplingParams(4))


def test_sampling_is_seeded_and_respects_top_k():
    model = tiny_model()
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_k=3)
    a = Decoder(model).generate(ids, mask, params, torch.Generator().manual_seed(1))
    b = Decoder(model).generate(ids, mask, params, torch.Generator().manual_seed(1))
    c = Decoder(model).generate(ids, mask, params, torch.Generator().manual_seed(2))
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_sample_tokens_distribution_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(20000, 4)
    gen = torch.Generator().manual_seed(0)
    full = torch.bincount(sample_tokens(logits, SamplingParams(1, temperature=1.0), gen), minlength=4) / 20000
    assert full.tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=0.015)
    top2 = torch.bincount(sample_tokens(logits, SamplingParams(1, top_k=2), gen), minlength=4) / 20000
    assert top2.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=0.015)
    # top_p 0.7: 0.5 alone < 0.7, so 0.3 joins; the mass before 0.15 is 0.8 >= 0.7, so it is dropped.
    nucleus = torch.bincount(sample_tokens(logits, SamplingParams(1, top_p=0.7), gen), minlength=4) / 20000
    assert nucleus.tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0], abs=0.015)
    greedy = sample_tokens(logits[:2], SamplingParams(1, temperature=0.0))
    assert greedy.tolist() == [0, 0]


def test_grouped_query_decode_reads_kv_heads_once_and_matches_hf_sdpa(monkeypatch):
    model = tiny_model("qwen2", "sdpa")  # 4 query heads over 2 kv heads
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=6, temperature=0.0, pad_token_id=PAD)
    plain = Decoder(model)
    plain.gqa_decode = False
    want = plain.generate(ids, mask, params).response_ids
    shapes = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        shapes.append((tuple(q.shape), tuple(k.shape)))
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    got = Decoder(model).generate(ids, mask, params).response_ids
    assert torch.equal(got, want)
    # decode steps: queries packed as [B, kv heads, groups, D] against unrepeated [B, kv heads, L, D]
    assert any(q[1:3] == (2, 2) and k[1] == 2 for q, k in shapes), shapes[:4]
    assert model.config._attn_implementation == "sdpa"


def test_capture_seconds_count_only_the_calls_that_built_decode_batches():
    model = tiny_model()
    decoder = Decoder(model, static_cache=True, batch_rows=2)
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    decoder.generate(ids, mask, params)
    assert decoder.last_stats["captureSeconds"] > 0  # the 2-row batch (and its compaction target) built
    built = decoder.capture_seconds_total
    decoder.generate(ids, mask, params)
    assert decoder.last_stats["captureSeconds"] == 0.0 and decoder.capture_seconds_total == built  # reused
    decoder.generate(ids, mask, SamplingParams(max_new_tokens=7, temperature=0.0))  # a new cache length
    assert decoder.last_stats["captureSeconds"] > 0


def test_a_model_compile_cannot_take_is_decoded_uncompiled(monkeypatch, caplog):
    """Decoding through compiled layers (engine/decode_layers.py) that fail to compile falls back
    to the uncompiled layers for this call and the later ones, with a warning, and the same tokens."""
    import rlkube.runtime.engine.decode_layers as decode_layers

    def failing_compile(fn, **kwargs):
        def call(*args, **kw):
            raise torch._dynamo.exc.TorchDynamoException("cannot trace this model")
        return call

    model = tiny_model()
    ids, mask = left_padded(PROMPTS)
    params = SamplingParams(max_new_tokens=6, temperature=0.0, pad_token_id=PAD)
    expected = Decoder(model).generate(ids, mask, params).response_ids
    monkeypatch.setattr(decode_layers.torch, "compile", failing_compile)
    decoder = Decoder(model, compile_layers=True)
    with caplog.at_level("WARNING"):
        out = decoder.generate(ids, mask, params)
    assert torch.equal(out.response_ids, expected)
    assert "compiling the decoder layers failed" in caplog.text
    assert not decoder.compiled_layers.enabled
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)
    assert torch.equal(decoder.generate(ids, mask, params).response_ids, expected)


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_greedy_first_64_tokens_match_hf_generate(model_type):
    """Temperature 0: the engine's first 64 tokens are Hugging Face generate's greedy ones (float32,
    left-padded prompts of mixed lengths, no EOS), so a rollout is the model's own output."""
    model = tiny_model(model_type, "sdpa", seed=3)
    ids, mask = left_padded(PROMPTS)
    ours = Decoder(model).generate(ids, mask, SamplingParams(max_new_tokens=64, temperature=0.0, pad_token_id=PAD))
    with torch.no_grad():
        theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=64, min_new_tokens=64,
                                do_sample=False, pad_token_id=PAD, eos_token_id=None)
    assert ours.response_ids.tolist() == theirs[:, ids.shape[1]:].tolist()
