"""Packing gives the same per-sample log-probs as unpacked computation; chunked log-probs are exact."""

import pytest
import torch

from rlkube.runtime.contract.config import ModelSpec
from rlkube.runtime.data.packing import block_causal_mask, pack_pairs, pad_pairs
from rlkube.runtime.data.preferences import PreferenceData
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.engine.logprobs import SequenceLogprobs, token_logprobs

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def lm():
    from rlkube.runtime.engine.models import build_causal_lm

    torch.set_num_threads(1)
    spec = ModelSpec(
        config=dict(model_type="qwen2", vocab_size=259, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, tie_word_embeddings=True),
        dtype="float32", attention="sdpa",
    )
    model, attention = build_causal_lm(spec, torch.device("cpu"), seed=1)
    assert attention == "sdpa"
    return SequenceLogprobs(model.eval(), chunk=7)


def varied_data(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    rand = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()  # noqa: E731
    # different prompt and response lengths, chosen and rejected of different lengths
    return PreferenceData(
        prompts=[rand(3 + 4 * i) for i in range(n)],
        chosen=[rand(2 + 3 * i) for i in range(n)],
        rejected=[rand(9 - i) for i in range(n)],
    )


def one_by_one(lm, data, ids):
    return torch.cat([lm(pad_pairs(data, [i], TOK.bos_id, TOK.eos_id, TOK.pad_id)) for i in ids])


@pytest.mark.parametrize(
    "explicit_mask, row_tokens",
    [(True, None), (False, None), (True, 40), (False, 40)],
    ids=["block-mask", "position-ids", "rows-block-mask", "rows-position-ids"],
)
def test_packed_equals_unpacked(lm, explicit_mask, row_tokens):
    data = varied_data()
    ids = [0, 1, 2, 3, 4]
    with torch.no_grad():
        batch = pack_pairs(data, ids, TOK.bos_id, TOK.eos_id, explicit_mask=explicit_mask,
                           row_tokens=row_tokens, pad=TOK.pad_id)
        if row_tokens:
            assert batch.input_ids.shape[0] > 1 and batch.input_ids.shape[1] <= 40
        packed = lm(batch)
        alone = one_by_one(lm, data, ids)
    assert packed.shape == (10,)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("explicit_mask", [True, False], ids=["block-mask", "position-ids"])
def test_min_width_pads_a_short_row_without_changing_logprobs(lm, explicit_mask):
    """A packed row shorter than `min_width` (what a compiled layer is given, engine/models.py
    COMPILED_MIN_TOKENS) is padded up to it; the padding is a block of its own, so the scored
    sequences' log-probs do not move."""
    data, ids = varied_data(), [0, 1]
    with torch.no_grad():
        batch = pack_pairs(data, ids, TOK.bos_id, TOK.eos_id, explicit_mask=explicit_mask, pad=TOK.pad_id,
                           multiple_of=8, min_width=96)
        assert sum(batch.seq_lens) < 96 and batch.input_ids.shape == (1, 96)
        wide = pack_pairs(data, [0, 1, 2, 3, 4], TOK.bos_id, TOK.eos_id, pad=TOK.pad_id, multiple_of=8, min_width=16)
        assert wide.input_ids.shape[1] == -(-sum(wide.seq_lens) // 8) * 8  # longer rows: only the multiple
        torch.testing.assert_close(lm(batch), one_by_one(lm, data, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("padding_mask", [True, False], ids=["padding-mask", "right-padding-no-mask"])
def test_padded_batch_equals_unpacked(lm, padding_mask):
    data = varied_data(seed=3)
    with torch.no_grad():
        padded = lm(pad_pairs(data, [4, 0, 2], TOK.bos_id, TOK.eos_id, TOK.pad_id, padding_mask=padding_mask))
        alone = one_by_one(lm, data, [4, 0, 2])
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)


def test_without_the_mask_samples_would_leak(lm):
    # The test above could pass vacuously if attention ignored context; show it does not.
    data = varied_data()
    batch = pack_pairs(data, [0, 1, 2], TOK.bos_id, TOK.eos_id, explicit_mask=True)
    batch.attention_mask = torch.ones_like(batch.attention_mask).tril()[:, :, :, :]  # plain causal
    with torch.no_grad():
        leaky = lm(batch)
        alone = one_by_one(lm, data, [0, 1, 2])
    assert (leaky[2:] - alone[2:]).abs().max() > 1e-3


def test_packed_gradients_equal_unpacked(lm):
    data = varied_data(seed=5)
    ids = [1, 3]
    params = [p for p in lm.parameters()]

    def grads(fn):
        lm.zero_grad(set_to_none=True)
        fn().sum().backward()
        return [p.grad.clone() for p in params]

    g_packed = grads(lambda: lm(pack_pairs(data, ids, TOK.bos_id, TOK.eos_id)))
    g_alone = grads(lambda: one_by_one(lm, data, ids))
    for a, b in zip(g_packed, g_alone, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_block_causal_mask_shape_and_blocks():
    m = block_causal_mask([2, 3])[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_targets_cover_response_tokens_and_eos():
    data = PreferenceData(prompts=[[10, 11]], chosen=[[20, 21, 22]], rejected=[[30]])
    b = pack_pairs(data, [0], TOK.bos_id, TOK.eos_id)
    # chosen seq: bos 10 11 20 21 22 eos (7 tokens), rejected: bos 10 11 30 eos (5 tokens)
    assert b.seq_lens == [7, 5]
    assert b.input_ids[0].tolist()[:7] == [TOK.bos_id, 10, 11, 20, 21, 22, TOK.eos_id]
    assert b.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4]
    assert b.target_ids.tolist() == [20, 21, 22, TOK.eos_id, 30, TOK.eos_id]
    assert b.target_index.tolist() == [2, 3, 4, 5, 9, 10]
    assert b.target_seq.tolist() == [0, 0, 0, 0, 1, 1]
    assert b.response_tokens.tolist() == [4.0, 2.0]
    assert b.real_tokens == 12


def test_chunked_logprobs_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(11, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(13, 6, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, 13, (11,), generator=g)
    ref = torch.log_softmax(h @ w.t(), -1).gather(1, y[:, None]).squeeze(1)
    torch.testing.assert_close(token_logprobs(h, w, y, chunk=4), ref)
    assert torch.autograd.gradcheck(lambda a, b: token_logprobs(a, b, y, 4), (h, w))


@pytest.fixture(scope="module")
def eager_lm():
    from rlkube.runtime.engine.models import build_causal_lm

    spec = ModelSpec(
        config=dict(model_type="qwen2", vocab_size=259, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=128, tie_word_embeddings=True),
        dtype="float32", attention="eager",
    )
    model, attention = build_causal_lm(spec, torch.device("cpu"), seed=1)
    assert attention == "eager"
    return SequenceLogprobs(model.eval(), chunk=7)


@pytest.mark.parametrize("row_tokens", [None, 40], ids=["one-row", "rows"])
def test_packed_equals_unpacked_eager_from_position_ids(eager_lm, row_tokens):
    # The DPO trainer's eager path on CPU: no mask passed, transformers' masking_utils builds the
    # block-causal mask from position ids that restart. transformers 4.53.0 and older did not
    # (packed sequences attended to each other, log-probs off by ~0.2), hence transformers>=4.53.1.
    data = varied_data(seed=5)
    ids = [0, 1, 2, 3, 4]
    with torch.no_grad():
        batch = pack_pairs(data, ids, TOK.bos_id, TOK.eos_id, explicit_mask=False, row_tokens=row_tokens,
                           pad=TOK.pad_id)
        assert batch.attention_mask is None and (batch.position_ids[:, 1:] == 0).any()
        packed = eager_lm(batch)
        alone = one_by_one(eager_lm, data, ids)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
