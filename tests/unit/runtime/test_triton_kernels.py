"""The decode step's Triton kernels, run by Triton's interpreter on CPU: the live-slot attention
(engine/decode_attention.py) and the fused sampler (engine/sampling_kernel.py).

Triton decides at a kernel's first launch whether to interpret it, from TRITON_INTERPRET, and the
module reads that variable once at import: so the kernel's checks run in a child pytest of this
file with the variable set (`test_kernels_in_triton_interpreter`), and are skipped in this process.
"""

import os
import subprocess
import sys

import pytest
import torch

from rlkube.runtime.engine import decode_attention as da

IN_INTERPRETER = pytest.mark.skipif(not da.INTERPRET, reason="runs in the child process with TRITON_INTERPRET=1")


@pytest.mark.slow
@pytest.mark.skipif(not da.HAVE_TRITON, reason="Triton is not installed")
@pytest.mark.skipif(da.INTERPRET, reason="the parent of the interpreter run")
def test_kernels_in_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                          "-k", "not test_kernels_in_triton_interpreter", __file__],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, run.stdout[-2000:]


def test_split_count_fills_the_card_and_keeps_splits_two_blocks_long():
    assert da.split_count(rows=256, kv_heads=2, read_len=384, programs=528) == 2
    assert da.split_count(rows=64, kv_heads=2, read_len=384, programs=528) == 3  # 384 // 128 caps it
    assert da.split_count(rows=64, kv_heads=2, read_len=2048, programs=528) == 5
    assert da.split_count(rows=1024, kv_heads=8, read_len=4096, programs=528) == 1
    assert da.split_count(rows=4, kv_heads=1, read_len=64, programs=528) == 1


def test_not_supported_on_cpu_outside_the_interpreter_or_for_float_masks():
    q, k = torch.zeros(2, 4, 1, 16), torch.zeros(2, 2, 64, 16)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    assert da.supported(q, k, mask) == da.INTERPRET
    assert not da.supported(q, k, mask.float())
    assert not da.supported(torch.zeros(2, 4, 3, 16), k, mask)  # a prefill: more than one query token
    assert not da.supported(q, k, None)
    assert not da.supported(q, k[:, :, :1], mask[..., :1])  # a one-slot read (the batch's first prefill)


def _cache_views(rows, kv_heads, slots, read, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(3, rows, kv_heads, slots, dim, generator=g)
    values = torch.randn(3, rows, kv_heads, slots, dim, generator=g)
    # a layer's slice of the stacked decode cache, as the decoder hands it to attention
    return keys.select(0, 1).narrow(2, 0, read), values.select(0, 1).narrow(2, 0, read)


@IN_INTERPRETER
@pytest.mark.parametrize("rows,q_heads,kv_heads,dim,read", [
    (3, 12, 2, 128, 136),  # Qwen2.5-1.5B's heads, one split
    (2, 4, 4, 64, 64),     # no grouping
    (5, 14, 2, 80, 512),   # a head size that is not a power of two, four splits
])
def test_matches_sdpa_over_live_slots(rows, q_heads, kv_heads, dim, read):
    key, value = _cache_views(rows, kv_heads, read + 8, read, dim)
    query = torch.randn(rows, q_heads, 1, dim, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(rows, 1, 1, read + 8, dtype=torch.bool)
    for r in range(rows):
        # left padding (row 2's covers a whole block of 64), then live slots up to a row's own length
        pad, live = (0, 5, 70, 3, 9)[r], min(read, (read, 20, 100, 64, 300)[r])
        mask[r, 0, 0, pad:live] = True
    mask = mask[..., :read]  # the step's read-length view of a wider mask, as decode_batch passes it
    got = da.live_decode_attention(query, key, value, mask, 0.125)
    want = da.reference(query, key, value, mask, 0.125)
    assert got.shape == (rows, 1, q_heads, dim)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@IN_INTERPRETER
def test_slots_past_the_live_length_are_never_read():
    key, value = _cache_views(2, 2, 136, 128, 32)
    query = torch.randn(2, 4, 1, 32)
    mask = torch.zeros(2, 1, 1, 128, dtype=torch.bool)
    mask[:, ..., :40] = True
    want = da.live_decode_attention(query, key, value, mask, None)
    # NaN in every block with no live slot: a kernel that loaded them would return NaN
    key[..., 64:, :] = float("nan")
    value[..., 64:, :] = float("nan")
    got = da.live_decode_attention(query, key, value, mask, None)
    assert torch.equal(got, want) and not got.isnan().any()


@IN_INTERPRETER
def test_decoder_with_the_kernel_matches_the_sdpa_decoder_with_refill():
    from test_generation import PAD, PROMPTS, left_padded, tiny_model

    from rlkube.runtime.engine.generation import Decoder, SamplingParams

    model = tiny_model("qwen2", "sdpa")
    ids, mask = left_padded(PROMPTS + [[3, 4], [8, 9, 10, 11, 12]])
    params = SamplingParams(max_new_tokens=10, temperature=0.0, pad_token_id=PAD)
    plain = Decoder(model, static_cache=True, batch_rows=2)
    plain.live_attention = False
    want = plain.generate(ids, mask, params)
    calls = []
    real = da.live_decode_attention

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    import rlkube.runtime.engine.generation as generation

    generation.live_kernel.live_decode_attention = spy
    try:
        got = Decoder(model, static_cache=True, batch_rows=2).generate(ids, mask, params)
    finally:
        generation.live_kernel.live_decode_attention = real
    assert calls, "the decode steps did not reach the kernel"
    assert torch.equal(got.response_ids, want.response_ids)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=1e-5, rtol=1e-5)


@IN_INTERPRETER
def test_fused_sampler_draws_from_the_softmax_and_records_its_log_prob():
    from rlkube.runtime.engine import sampling_kernel as sk
    from rlkube.runtime.engine.sampling import SamplingParams, sampled_logprobs

    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    # 4 rows of a 5-token vocabulary at temperature 2 (the logits scaled so softmax(logits / 2) = probs)
    logits = (2 * torch.log(probs.clamp_min(1e-30))).expand(4, 5).contiguous()
    params = SamplingParams(max_new_tokens=1, temperature=2.0)
    assert sk.fused(logits, params)
    assert not sk.fused(logits, SamplingParams(1, temperature=0.0)) and not sk.fused(logits, SamplingParams(1, top_k=2))
    seed = torch.tensor(11, dtype=torch.long)
    counts = torch.zeros(5)
    for _ in range(200):
        tokens, logprobs = sk.sample_with_logprobs(logits, params, seed)
        seed += 1
        counts += torch.bincount(tokens, minlength=5)
        torch.testing.assert_close(logprobs, sampled_logprobs(logits, tokens, params), atol=1e-5, rtol=1e-5)
    assert (counts / counts.sum()).tolist() == pytest.approx(probs.tolist(), abs=0.045)  # 800 draws: 2.5 sd
    assert counts[4] == 0  # a token of probability 0 is never drawn
    first, _ = sk.sample_with_logprobs(logits, params, torch.tensor(5, dtype=torch.long))
    again, _ = sk.sample_with_logprobs(logits, params, torch.tensor(5, dtype=torch.long))
    assert torch.equal(first, again)  # the same seed draws the same tokens


@IN_INTERPRETER
def test_fused_sampler_over_a_vocabulary_of_several_blocks():
    from rlkube.runtime.engine import sampling_kernel as sk
    from rlkube.runtime.engine.sampling import SamplingParams, sampled_logprobs

    vocab = 2 * sk.BLOCK_V + 77
    logits = torch.full((2, vocab), -30.0)
    logits[0, sk.BLOCK_V + 5] = 10.0  # all the mass on one token, in the second block
    logits[1, vocab - 1] = 10.0  # and on the last token of the partial third block
    params = SamplingParams(max_new_tokens=1, temperature=1.0)
    tokens, logprobs = sk.sample_with_logprobs(logits, params, torch.tensor(3, dtype=torch.long))
    assert tokens.tolist() == [sk.BLOCK_V + 5, vocab - 1]
    torch.testing.assert_close(logprobs, sampled_logprobs(logits, tokens, params), atol=1e-5, rtol=1e-5)


@IN_INTERPRETER
def test_a_decode_step_under_autograd_takes_sdpa():
    """The kernel has no backward: with grad enabled the decode attention is sdpa's."""
    from rlkube.runtime.engine import generation

    key, value = _cache_views(2, 2, 72, 64, 16)
    query = torch.randn(2, 4, 1, 16, requires_grad=True)
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    module = torch.nn.Module()
    module.num_key_value_groups = 2
    out, _ = generation._live_decode_attention(module, query, key, value, mask)
    assert out.requires_grad  # sdpa's output, with its backward
    with torch.no_grad():
        kernel_out, _ = generation._live_decode_attention(module, query, key, value, mask)
    assert not kernel_out.requires_grad
    torch.testing.assert_close(kernel_out, out.detach(), atol=1e-5, rtol=1e-5)
