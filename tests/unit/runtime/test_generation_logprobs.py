"""Generation records, for each token it samples, the token's log-prob under the distribution it
sampled from: log_softmax(logits.float() / T) at the token (T = 1 at temperature 0), the full
softmax also under top-k / top-p (what the trainer's forward computes). Every decoding path records
them, and in float32 on a CPU they are the trainer's log-probs of the same tokens."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.engine import decode_batch
from rlkube.runtime.engine.generation import Decoder
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.engine.sampling import SamplingParams, sample_tokens, sampled_logprobs

torch.set_num_threads(1)
VOCAB, PAD = 40, 0


def logits_batch(rows: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def tempered(logits: torch.Tensor, tokens: torch.Tensor, t: float) -> torch.Tensor:
    return torch.log_softmax(logits.float() / t, dim=-1).gather(1, tokens[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_sampled_logprobs_are_the_tempered_softmax_at_the_sampled_token(temperature):
    logits = logits_batch()
    before = logits.clone()
    params = SamplingParams(1, temperature=temperature)
    tokens = sample_tokens(logits, params, torch.Generator().manual_seed(1))
    got = sampled_logprobs(logits, tokens, params)
    assert got.dtype == torch.float32 and got.shape == (64,)
    assert torch.allclose(got, tempered(logits, tokens, temperature), atol=1e-5, rtol=0)
    assert torch.equal(logits, before)  # fp32 logits are not divided in place
    if temperature != 1.0:  # the temperature is applied (not vacuous)
        assert (got - tempered(logits, tokens, 1.0)).abs().max() > 1e-2


def test_greedy_records_the_models_own_distribution():
    logits = logits_batch()
    params = SamplingParams(1, temperature=0.0)
    tokens = sample_tokens(logits, params)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    got = sampled_logprobs(logits, tokens, params)
    assert torch.allclose(got, tempered(logits, tokens, 1.0), atol=1e-5, rtol=0)


@pytest.mark.parametrize("restriction", [{"top_k": 3}, {"top_p": 0.5}])
def test_top_k_and_top_p_record_the_full_tempered_softmax(restriction):
    """The sampler draws from the restricted, renormalised distribution; the log-prob recorded is
    the full temperature-scaled softmax's (the training forward's), lower than the restricted one's."""
    logits = logits_batch()
    params = SamplingParams(1, temperature=0.8, **restriction)
    tokens = sample_tokens(logits, params, torch.Generator().manual_seed(2))
    got = sampled_logprobs(logits, tokens, params)
    assert torch.allclose(got, tempered(logits, tokens, 0.8), atol=1e-5, rtol=0)
    if "top_k" in restriction:
        kth = torch.topk(logits, 3, dim=-1).values[:, -1:]
        restricted = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")) / 0.8, dim=-1)
        above = restricted.gather(1, tokens[:, None])[:, 0] - got
        assert above.min() > 0 and above.mean() > 1e-2


def test_bf16_logits_give_fp32_log_probs_of_their_fp32_values():
    logits = logits_batch().to(torch.bfloat16)
    before = logits.clone()
    params = SamplingParams(1, temperature=0.6)
    tokens = sample_tokens(logits, params, torch.Generator().manual_seed(3))
    got = sampled_logprobs(logits, tokens, params)
    assert got.dtype == torch.float32
    assert torch.allclose(got, tempered(logits, tokens, 0.6), atol=1e-5, rtol=0)
    assert torch.equal(logits, before)


def tiny_lm() -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                  tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).eval()
    with torch.no_grad():  # random-init logits are nearly flat: sharpen them, so EOS ends some rows
        model.lm_head.weight.mul_(6.0)
    return model


def eos_with_spread(lm, ids, mask, steps: int) -> int:
    """A token that ends greedy completions at the most distinct lengths."""
    free = Decoder(lm, static_cache=False).generate(ids, mask, SamplingParams(steps, temperature=0.0))
    firsts = {}
    for token in range(1, VOCAB):
        hits = (free.response_ids == token).int()
        firsts[token] = torch.where(hits.any(1), hits.argmax(1), steps).unique().numel()
    return max(firsts, key=firsts.get)


def prompts(count: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, VOCAB, (count, 6), generator=g)
    mask = torch.ones_like(ids)
    for row in range(count):
        mask[row, : row % 4] = 0
    return ids * mask, mask


PATHS = {  # Decoder settings: every way a rollout is decoded
    "plain loop": {"static_cache": False},
    "plain loop in waves": {"static_cache": False, "batch_rows": 3, "refill": False},
    "decode batch": {},
    "decode batch, refill": {"batch_rows": 3},
    "decode batch, waves": {"batch_rows": 3, "refill": False},
    "decode batch, compacted": {"batch_rows": 8},
}


@pytest.mark.parametrize("temperature", [0.7, 0.0])
@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_decoding_path_records_the_trainers_log_probs(path, temperature, monkeypatch):
    """float32 on a CPU: the recorded log-prob of every generated token is the training forward's
    (PolicyModel at the rollout's temperature) within 1e-5, and 0 on the padding after EOS."""
    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)
    monkeypatch.setattr(decode_batch, "EOS_CHECK_EVERY", 2)  # rows harvested, refilled, compacted early
    lm = tiny_lm()
    ids, mask = prompts()
    params = SamplingParams(max_new_tokens=16, temperature=temperature, eos_token_id=eos_with_spread(lm, ids, mask, 16),
                            pad_token_id=PAD)
    decoder = Decoder(lm, **PATHS[path])
    out = decoder.generate(ids, mask, params, torch.Generator().manual_seed(5))
    assert out.logprobs is not None and out.logprobs.shape == out.response_ids.shape
    resp = out.response_mask.bool()
    assert (~resp).any() and resp.any()  # some rows stopped at EOS: padding is checked too
    if "compacted" in path:
        assert decoder.last_stats["compactions"] >= 1, decoder.last_stats
    with torch.no_grad():
        trained, _ = PolicyModel(lm, temperature=temperature)(out.sequences, out.attention_mask, ids.shape[1],
                                                              out.response_mask)
    assert (out.logprobs[resp] < 0).all()
    assert torch.allclose(out.logprobs[resp], trained[resp], atol=1e-5, rtol=0), \
        (out.logprobs - trained)[resp].abs().max()
    assert out.logprobs[~resp].abs().sum() == 0
