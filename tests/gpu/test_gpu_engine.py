"""GPU tier, engine: what only a CUDA device exercises, on a tiny random qwen2.

Run on a machine with a CUDA GPU, from the repository root (torch, transformers, pydantic, pyyaml,
nvidia-ml-py and pytest are all it needs):
    PYTHONPATH=runtime python -m pytest tests/gpu -q
Without CUDA every test here is skipped.

- bf16 packed rows (the explicit block mask, and the mask transformers builds from restarting
  position ids) give the per-token log-probs of one sequence a row. bf16 keeps 8 bits of
  mantissa: a log-prob near -5.6 is resolved to ~0.03, and the packed and padded rows run
  different sdpa kernels (masked vs causal), so the tolerance is atol 0.1 per token (on a CPU
  the two agree to 2e-3). Without the mask a token moves by ~0.45 on this model (checked, > 0.3,
  so the comparison can fail).
- greedy decoding with the static cache and CUDA graphs (the rollout path) gives the tokens of
  the eager path (dynamic cache, no graphs), also through the hybrid engine, and on a replay of
  the captured graph; with 3 rows refilled at EOS over 10 prompts (and the drain compacted)
  too. float32 with TF32 off and
  a sharpened head, so no argmax is a near-tie. Sampling inside the graph repeats for one seed.
- the log-probs the captured decode step records for the tokens it samples (bf16, refilled and
  compacted rows) are the training forward's of the same tokens within bf16 rounding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from rlkube.runtime.data.packing import pack_pairs, pad_pairs  # noqa: E402
from rlkube.runtime.data.preferences import PreferenceData  # noqa: E402
from rlkube.runtime.engine.generation import Decoder, SamplingParams  # noqa: E402
from rlkube.runtime.engine.hybrid_engine import HybridEngine  # noqa: E402
from rlkube.runtime.engine.logprobs import SequenceLogprobs  # noqa: E402
from rlkube.runtime.engine.policy import PolicyModel  # noqa: E402

BOS, EOS, PAD = 257, 258, 256
DEVICE = torch.device("cuda", 0)


def tiny_lm(dtype: torch.dtype, attention: str = "sdpa"):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen2", vocab_size=259, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).to(DEVICE, dtype).eval()


def pairs(n: int = 6) -> PreferenceData:
    g = torch.Generator().manual_seed(0)
    rand = lambda k: torch.randint(0, 256, (k,), generator=g).tolist()  # noqa: E731
    return PreferenceData(prompts=[rand(5 + 7 * i) for i in range(n)], chosen=[rand(3 + 5 * i) for i in range(n)],
                          rejected=[rand(20 - 2 * i) for i in range(n)])


@pytest.mark.parametrize("explicit_mask", [True, False], ids=["block-mask", "position-ids"])
def test_bf16_packed_log_probs_equal_one_sequence_a_row(explicit_mask):
    model = SequenceLogprobs(tiny_lm(torch.bfloat16))
    data, ids = pairs(), list(range(6))
    with torch.no_grad():
        packed_batch = pack_pairs(data, ids, BOS, EOS, explicit_mask=explicit_mask, pad=PAD).to(DEVICE)
        packed = model(packed_batch, per_token=True)
        padded = model(pad_pairs(data, ids, BOS, EOS, PAD).to(DEVICE), per_token=True)
        if explicit_mask:
            leaky = pack_pairs(data, ids, BOS, EOS, explicit_mask=True, pad=PAD)
            leaky.attention_mask = torch.ones_like(leaky.attention_mask).tril()
            leak = (model(leaky.to(DEVICE), per_token=True) - padded).abs().max()
            assert leak > 0.3, "without the block mask sequences should see each other; the test is too weak"
    assert packed.dtype == torch.float32 and packed.shape == padded.shape
    torch.testing.assert_close(packed, padded, rtol=0.0, atol=0.1)


@pytest.fixture
def fp32_exact():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def prompts(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt block."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(0, 256, (n,), generator=g)
        mask[row, width - n :] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


def test_greedy_tokens_with_cuda_graphs_and_static_cache_equal_the_eager_path(fp32_exact):
    lm = tiny_lm(torch.float32)
    with torch.no_grad():
        lm.lm_head.weight.mul_(30.0)  # sharpen: random-init logits are nearly flat, argmax ties flip
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, eos_token_id=EOS, pad_token_id=PAD)
    eager = Decoder(lm, static_cache=False, cuda_graphs=False)
    graphs = Decoder(lm)
    assert graphs.static_cache and graphs.cuda_graphs
    engine = HybridEngine(PolicyModel(lm))
    for seed in (1, 2):  # the second batch replays the graph captured for the first (same shape)
        ids, mask = prompts([9, 3, 14, 6], seed)
        want = eager.generate(ids, mask, greedy)
        got = graphs.generate(ids, mask, greedy)
        assert graphs.cuda_graphs, "graph capture failed and the decoder fell back to eager decoding"
        assert torch.equal(got.response_ids, want.response_ids), seed
        assert torch.equal(engine.generate(ids, mask, greedy).response_ids, want.response_ids), seed
    assert want.response_ids.shape[1] > 1


def test_refilled_rows_in_cuda_graphs_give_the_eager_greedy_tokens_and_sampling_is_seeded(fp32_exact, monkeypatch):
    """Continuous batching on the GPU: 10 prompts on 3 rows, refilled at EOS, every step a graph
    replay (sampling inside), give the plain eager loop's greedy tokens in prompt order; sampled
    runs in graphs repeat for one seed and differ for another."""
    from rlkube.runtime.engine import decode_batch

    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)  # the drain moves into 1-row graphs too
    lm = tiny_lm(torch.float32)
    with torch.no_grad():
        lm.lm_head.weight.mul_(30.0)
    ids, mask = prompts([9, 3, 14, 6, 1, 11, 5, 8, 2, 13], 3)
    free = Decoder(lm, static_cache=False, cuda_graphs=False).generate(ids, mask, SamplingParams(32, 0.0))
    eos = int(free.response_ids[:, 5].mode().values)  # a token some rows emit early
    greedy = SamplingParams(max_new_tokens=32, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    want = Decoder(lm, static_cache=False, cuda_graphs=False).generate(ids, mask, greedy)
    for refill in (True, False):
        decoder = Decoder(lm, batch_rows=3, refill=refill)
        got = decoder.generate(ids, mask, greedy)
        assert decoder.cuda_graphs and decoder._batch.graphs, "graph capture failed; decoded eagerly"
        assert torch.equal(got.response_ids, want.response_ids), refill
        assert torch.equal(got.response_mask, want.response_mask), refill
        # graphs are captured at a bucket's third step (decode_batch.CAPTURE_AFTER): a compacted
        # batch with fewer steps at every bucket has none, but none may have failed to capture
        assert all(b.use_graphs for b in decoder._smaller.values()), "a compacted batch's capture failed"
    sampled = SamplingParams(max_new_tokens=32, temperature=1.0, eos_token_id=eos, pad_token_id=PAD)
    decoder = Decoder(lm, batch_rows=3)
    runs = [decoder.generate(ids, mask, sampled, torch.Generator(DEVICE).manual_seed(s)).response_ids
            for s in (1, 1, 2)]
    assert decoder.cuda_graphs
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_log_probs_recorded_in_the_cuda_graphs_are_the_training_forwards(monkeypatch):
    """bf16, sampled at temperature 0.7 with top-k inside the captured decode graphs (10 prompts
    on 3 rows refilled at EOS, the drain compacted into smaller graphs): the log-prob recorded for
    each sampled token is the training forward's (PolicyModel at the same temperature, whole
    sequences, no cache) within bf16 rounding, mean |diff| < 0.02 over the generated tokens, and 0
    on the padding. Against the untempered forward the gap is far larger (the graph applies T)."""
    from rlkube.runtime.engine import decode_batch

    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)
    lm = tiny_lm(torch.bfloat16)
    with torch.no_grad():
        lm.lm_head.weight.mul_(4.0)  # random-init logits are nearly flat: give the temperature something to do
    ids, mask = prompts([9, 3, 14, 6, 1, 11, 5, 8, 2, 13], 4)
    free = Decoder(lm, static_cache=False, cuda_graphs=False).generate(ids, mask, SamplingParams(32, 0.0))
    eos = int(free.response_ids[:, 5].mode().values)  # a token some rows emit early
    params = SamplingParams(max_new_tokens=32, temperature=0.7, top_k=50, eos_token_id=eos, pad_token_id=PAD)
    decoder = Decoder(lm, batch_rows=3)
    out = decoder.generate(ids, mask, params, torch.Generator(DEVICE).manual_seed(1))
    assert decoder.cuda_graphs and decoder._batch.graphs, "graph capture failed; decoded eagerly"
    assert out.logprobs.dtype == torch.float32 and out.logprobs.shape == out.response_ids.shape
    resp = out.response_mask.bool()
    with torch.no_grad():
        trained, _ = PolicyModel(lm, temperature=0.7)(out.sequences, out.attention_mask, ids.shape[1],
                                                      out.response_mask)
        untempered, _ = PolicyModel(lm)(out.sequences, out.attention_mask, ids.shape[1], out.response_mask)
    gap = (out.logprobs - trained)[resp].abs()
    assert torch.isfinite(out.logprobs).all() and (out.logprobs[resp] <= 0).all()
    assert float(gap.mean()) < 0.02, (float(gap.mean()), float(gap.max()))
    assert float((out.logprobs - untempered)[resp].abs().mean()) > 5 * max(float(gap.mean()), 0.01)
    assert out.logprobs[~resp].abs().sum() == 0


@pytest.mark.parametrize("rows,q_heads,kv_heads,dim", [(256, 12, 2, 128), (64, 32, 8, 64), (7, 14, 2, 64)])
def test_live_decode_attention_matches_sdpa_in_bf16(rows, q_heads, kv_heads, dim):
    """The live-slot decode kernel (engine/decode_attention.py) on the card: Qwen2.5-1.5B's and
    Llama-3.2-1B's heads, rows of every live length with left padding, against sdpa in fp32."""
    from rlkube.runtime.engine import decode_attention as da

    g = torch.Generator(device=DEVICE).manual_seed(0)
    read, slots = 448, 456
    keys = torch.randn(2, rows, kv_heads, slots, dim, device=DEVICE, dtype=torch.bfloat16, generator=g)
    values = torch.randn(2, rows, kv_heads, slots, dim, device=DEVICE, dtype=torch.bfloat16, generator=g)
    key, value = keys.select(0, 1).narrow(2, 0, read), values.select(0, 1).narrow(2, 0, read)
    query = torch.randn(rows, q_heads, 1, dim, device=DEVICE, dtype=torch.bfloat16, generator=g)
    live = torch.randint(1, read + 1, (rows,), device=DEVICE, generator=g)
    pad = (torch.rand(rows, device=DEVICE, generator=g) * live.float() * 0.5).long()
    slot = torch.arange(slots, device=DEVICE)
    mask = ((slot[None] >= pad[:, None]) & (slot[None] < live[:, None]))[:, None, None, :]
    assert da.supported(query, key, mask[..., :read])
    got = da.live_decode_attention(query, key, value, mask[..., :read], None)
    want = da.reference(query, key, value, mask[..., :read], None)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
