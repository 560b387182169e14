"""The decode step's sampler and its log-prob in one pass over the logits (Triton, CUDA).

Why: sampling.sample_tokens and sampling.sampled_logprobs are each right on their own, but
together they read a batch's [rows, vocabulary] logits four times and write two fp32 copies of
them (the noise, the fp32 logits): at 256 rows and a 151,936-token vocabulary ~0.7 GB of memory
traffic and six kernels a decode step. Here one program per row reads its logits once, in
blocks: it draws the Gumbel noise in the kernel (Philox, counter-based: no noise tensor), keeps
the running argmax of logits / T + noise (the Gumbel-max draw from softmax(logits / T), what
sample_tokens draws) and the running log-sum-exp of logits / T, and writes the token and its
log-prob under that softmax (what sampled_logprobs records).

Where: plain sampling only (temperature > 0, no top-k, no top-p; the RL default). The seed is a
device tensor that the decode step advances itself, so a captured CUDA graph draws new noise on
every replay; the draws of a call repeat for the same seed. Elsewhere (greedy, top-k, top-p,
CPU) sampling.py's torch path runs. The kernel runs in Triton's interpreter on CPU for tests.
"""

from __future__ import annotations

import functools

import torch

from rlkube.runtime.engine.decode_attention import HAVE_TRITON, INTERPRET
from rlkube.runtime.engine.sampling import SamplingParams

BLOCK_V = 4096  # vocabulary entries a program reads at a time


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["stride", "vocab"])
    def sample_kernel(logits_ptr, stride, vocab, seed_ptr, temperature, token_ptr, logprob_ptr,
                      BLOCK: tl.constexpr):
        row = tl.program_id(0)
        seed = tl.load(seed_ptr)
        cols = tl.arange(0, BLOCK)
        best = tl.full([], float("-inf"), tl.float32)
        best_index = tl.full([], 0, tl.int64)
        best_z = tl.full([], 0.0, tl.float32)
        m = tl.full([], float("-inf"), tl.float32)
        total = tl.full([], 0.0, tl.float32)
        start = 0
        while start < vocab:
            index = start + cols
            ok = index < vocab
            z = tl.load(logits_ptr + row * stride + index, mask=ok, other=float("-inf")).to(tl.float32)
            z = z / temperature  # divided, as the training forward does (sampling.sampled_logprobs)
            u = tl.rand(seed, (row * vocab + index).to(tl.int32))
            score = tl.where(ok, z - tl.log(-tl.log(u)), float("-inf"))
            block_best = tl.max(score, axis=0)
            if block_best > best:
                at = tl.argmax(score, axis=0)
                best = block_best
                best_index = (start + at).to(tl.int64)
                best_z = tl.sum(tl.where(cols == at, z, 0.0), axis=0)
            block_m = tl.max(z, axis=0)
            new_m = tl.maximum(m, block_m)
            total = total * tl.exp(m - new_m) + tl.sum(tl.where(ok, tl.exp(z - new_m), 0.0), axis=0)
            m = new_m
            start += BLOCK
        tl.store(token_ptr + row, best_index)
        tl.store(logprob_ptr + row, best_z - (m + tl.log(total)))

    return sample_kernel


def fused(logits: torch.Tensor, params: SamplingParams) -> bool:
    """Whether `sample_with_logprobs` samples `logits` in the kernel."""
    return (HAVE_TRITON and (logits.is_cuda or INTERPRET) and params.temperature > 0.0 and not params.top_k
            and params.top_p >= 1.0 and logits.dim() == 2 and logits.stride(1) == 1
            and logits.shape[0] * logits.shape[1] < 2**31)


def sample_with_logprobs(logits: torch.Tensor, params: SamplingParams, seed: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [rows] int64, its log-prob [rows] fp32) for `logits` [rows, vocab], drawn with the
    Philox stream of `seed` (an int64 device tensor of one element; the caller advances it between
    draws). Only where `fused` says so."""
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.long, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _kernel()[(rows,)](logits, logits.stride(0), vocab, seed, float(params.temperature), tokens, logprobs,
                       BLOCK=BLOCK_V)
    return tokens, logprobs
