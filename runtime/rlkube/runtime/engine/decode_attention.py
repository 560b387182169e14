"""Decode attention that reads only each row's live cache: split-KV (flash-decoding) in Triton.

Why: a decode step's query is one token per row, and the rows of a rollout batch hold very
different numbers of tokens (prompts of mixed lengths, left padding, completions that started at
different steps after a refill). sdpa over the step's read length reads every slot up to it for
every row, masked or not; at batch 256 on a 1.5B model that was 1.23 ms of a 5.5 ms step
(docs/benchmarks.md, "Rollout"). Here each program looks at the 'may attend' mask of a block of
slots first (one byte a slot) and loads that block's keys and values only when some slot of it
is live: slots past a row's last token and whole blocks of left padding cost a mask read.

How: one program per (row, key/value head, split of the read length). The query heads that share
a key/value head ride together as the rows of one small matrix product (grouped-query attention
reads each cached key once), scores use the online softmax, and a second kernel merges the
splits by their log-sum-exp. The split count is chosen so that there are a few programs per SM
whatever the batch: at batch 64 a row's keys are split four or more ways, at batch 256 not at all.

Where: `live_decode_attention` is an operator of its own (rlkube::live_decode_attention), so the
compiled decoder layers call it as one opaque kernel pair, inside the decode step's CUDA graph.
It needs a CUDA tensor, Triton, a boolean mask and a head size of at most 256; `supported` says
when, and the caller (generation.py) falls back to sdpa otherwise. On CPU the kernels run in
Triton's interpreter for tests (TRITON_INTERPRET=1, tests/unit/runtime/test_triton_kernels.py).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os

import torch

BLOCK_N = 64  # key slots a program loads at a time
MAX_HEAD_DIM = 256
# Read once at import: `supported` runs while dynamo traces a decoder layer, where a module
# lookup or an environment read would be traced too.
HAVE_TRITON = importlib.util.find_spec("triton") is not None
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _split_kernel():
    """Each program: one (row, key/value head, split)'s partial attention, its running max and sum."""
    import triton
    import triton.language as tl

    # Triton compiles a kernel again for each new value class of an int argument (1, a multiple of
    # 16, other) unless told not to: these vary with the batch and the read length.
    @triton.jit(do_not_specialize=["read_len", "split_len", "sk_b", "sv_b", "sm_b"])
    def split_kernel(q_ptr, k_ptr, v_ptr, valid_ptr, part_ptr, stat_ptr, scale,
                     sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b,
                     kv_heads, read_len, split_len,
                     GROUPS: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                     BLOCK: tl.constexpr, PRECISION: tl.constexpr):
        pid = tl.program_id(0)
        split = tl.program_id(1)
        row = pid // kv_heads
        head = pid % kv_heads
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D_PAD)
        n = tl.arange(0, BLOCK)
        g_ok = g < GROUPS
        d_ok = d < HEAD_DIM
        q = tl.load(q_ptr + row * sq_b + (head * GROUPS + g)[:, None] * sq_h + d[None, :],
                    mask=g_ok[:, None] & d_ok[None, :], other=0.0)
        m_i = tl.full([G_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D_PAD], tl.float32)
        start = split * split_len
        stop = tl.minimum(start + split_len, read_len)
        block = start
        while block < stop:
            slots = block + n
            live = tl.load(valid_ptr + row * sm_b + slots, mask=slots < stop, other=0) != 0
            if tl.max(live.to(tl.int32), axis=0) > 0:  # a block with no live slot is never read
                k = tl.load(k_ptr + row * sk_b + head * sk_h + slots[:, None] * sk_s + d[None, :],
                            mask=live[:, None] & d_ok[None, :], other=0.0)
                s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
                s = tl.where(live[None, :], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                # rows (query heads) with nothing live yet keep m = -inf; exp against 0 there, not NaN
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp(m_i - m_safe)
                p = tl.exp(s - m_safe[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                v = tl.load(v_ptr + row * sv_b + head * sv_h + slots[:, None] * sv_s + d[None, :],
                            mask=live[:, None] & d_ok[None, :], other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
                m_i = m_new
            block += BLOCK
        base = (pid * tl.num_programs(1) + split) * G_PAD
        tl.store(part_ptr + (base + g)[:, None] * D_PAD + d[None, :], acc)
        tl.store(stat_ptr + (base + g) * 2, m_i)
        tl.store(stat_ptr + (base + g) * 2 + 1, l_i)

    return split_kernel


@functools.cache
def _merge_kernel():
    """Each program: one (row, key/value head)'s splits merged by their log-sum-exp."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["splits"])
    def merge_kernel(part_ptr, stat_ptr, out_ptr, so_b, so_h, kv_heads, splits,
                     GROUPS: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
        pid = tl.program_id(0)
        row = pid // kv_heads
        head = pid % kv_heads
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D_PAD)
        first = pid * splits * G_PAD  # this (row, head)'s splits are consecutive
        m = tl.full([G_PAD], float("-inf"), tl.float32)
        split = 0
        while split < splits:  # a loop bound the kernel takes at run time: one compiled kernel for every split count
            m = tl.maximum(m, tl.load(stat_ptr + (first + split * G_PAD + g) * 2))
            split += 1
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        total = tl.zeros([G_PAD], tl.float32)
        acc = tl.zeros([G_PAD, D_PAD], tl.float32)
        split = 0
        while split < splits:
            base = first + split * G_PAD
            weight = tl.exp(tl.load(stat_ptr + (base + g) * 2) - m_safe)
            total += weight * tl.load(stat_ptr + (base + g) * 2 + 1)
            acc += weight[:, None] * tl.load(part_ptr + (base + g)[:, None] * D_PAD + d[None, :])
            split += 1
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(out_ptr + row * so_b + (head * GROUPS + g)[:, None] * so_h + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :])

    return merge_kernel


def _pow2(n: int, least: int) -> int:
    return max(least, 1 << (n - 1).bit_length())


@functools.cache
def _programs_wanted(device_index: int) -> int:
    """Programs that keep every SM of the card busy: four per SM (a guess for CPU)."""
    if not torch.cuda.is_available():
        return 4 * 132
    return 4 * torch.cuda.get_device_properties(device_index).multi_processor_count


def split_count(rows: int, kv_heads: int, read_len: int, programs: int) -> int:
    """Splits of the read length per (row, head): enough for `programs` programs, each split at
    least two blocks long."""
    most = max(1, read_len // (2 * BLOCK_N))
    return max(1, min(most, -(-programs // (rows * kv_heads))))


def supported(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether `live_decode_attention` takes this call: one query token per row, a read of at
    least one block of slots (the decode batch's first one-slot prefill is not a decode step: it
    would only compile the kernel once more, for a read length of 1), a boolean 'may attend' mask
    of shape [rows, 1, 1, slots], CUDA tensors (or Triton's interpreter) and a head size it handles."""
    return (HAVE_TRITON and query.shape[2] == 1 and key.shape[2] >= BLOCK_N and mask is not None
            and mask.dtype == torch.bool
            and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1 and mask.shape[3] == key.shape[2]
            and query.shape[-1] <= MAX_HEAD_DIM and query.shape[1] % key.shape[1] == 0
            and (query.is_cuda or INTERPRET))


@torch.library.custom_op("rlkube::live_decode_attention", mutates_args=())
def live_decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                          scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v for one query token per row, reading only the key blocks
    that hold a live slot. query [rows, q heads, 1, dim]; key, value [rows, kv heads, slots, dim]
    (any strides with a unit last one: a view of the decode cache); mask [rows, 1, 1, slots] bool.
    scale: 1/sqrt(dim) when None. Returns [rows, 1, q heads, dim] in the query's dtype (HF
    attention's output layout)."""
    if not HAVE_TRITON:
        raise RuntimeError("live_decode_attention: Triton is not installed (`supported` says when it can run)")
    split_kernel, merge_kernel = _split_kernel(), _merge_kernel()
    rows, q_heads, _, dim = query.shape
    kv_heads, read_len = key.shape[1], key.shape[2]
    groups = q_heads // kv_heads
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    g_pad, d_pad = _pow2(groups, 16), _pow2(dim, 16)
    splits = split_count(rows, kv_heads, read_len, _programs_wanted(query.device.index or 0))
    split_len = -(-read_len // (splits * BLOCK_N)) * BLOCK_N
    query = query.contiguous()
    valid = mask.view(torch.uint8)  # bool and uint8 share a byte: no copy
    part = torch.empty(rows * kv_heads * splits * g_pad, d_pad, dtype=torch.float32, device=query.device)
    stats = torch.empty(rows * kv_heads * splits * g_pad, 2, dtype=torch.float32, device=query.device)
    out = torch.empty(rows, 1, q_heads, dim, dtype=query.dtype, device=query.device)
    assert key.stride(3) == 1 and value.stride(3) == 1, "live_decode_attention: the head dimension must be contiguous"
    split_kernel[(rows * kv_heads, splits)](
        query, key, value, valid, part, stats, scale,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), valid.stride(0),
        kv_heads, read_len, split_len,
        GROUPS=groups, G_PAD=g_pad, HEAD_DIM=dim, D_PAD=d_pad, BLOCK=BLOCK_N,
        # fp32 in full precision (as the fp32 paths elsewhere, TF32 off); bf16/fp16 multiply in their own
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32")
    merge_kernel[(rows * kv_heads,)](
        part, stats, out, out.stride(0), out.stride(2), kv_heads, splits,
        GROUPS=groups, G_PAD=g_pad, HEAD_DIM=dim, D_PAD=d_pad)
    return out


@live_decode_attention.register_fake
def _live_decode_attention_fake(query, key, value, mask, scale=None):
    rows, q_heads, _, dim = query.shape
    return query.new_empty(rows, 1, q_heads, dim)


def reference(query, key, value, mask, scale=None) -> torch.Tensor:
    """What `live_decode_attention` computes, by sdpa with the key/value heads repeated (tests)."""
    groups = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float().repeat_interleave(groups, 1), value.float().repeat_interleave(groups, 1),
        attn_mask=mask, scale=scale)
    return out.transpose(1, 2).to(query.dtype)
