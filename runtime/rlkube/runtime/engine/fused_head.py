"""The language-model head fused with the log-softmax: per-token log-probs (and entropy) of
hidden states without a [tokens, vocab] logits tensor.

`token_logprobs(hidden, weight, targets)` returns log softmax(hidden @ weight.T / T)[targets] for
each row of `hidden` ([N, d]). A whole micro-batch of full-vocabulary logits is the largest tensor
of a training step (32k tokens x 151,936 for Qwen: 9.7 GB in bf16, twice that for the fp32
softmax, and again for its gradient); fused, at most one `chunk` of rows of it exists at a time,
in the forward *and* the backward pass. The forward keeps, per row, only the log-sum-exp (and the
entropy); the backward recomputes each chunk's logits from the saved hidden
states and head weight (the trade gradient checkpointing makes: one more [chunk, d] x [d, vocab]
matmul per chunk) and turns them into the log-softmax with one subtraction, no second reduction.

Gradients, per row with target y, z = logits / T, p = softmax(z):
  d logp / dz = onehot(y) - p,       d entropy / dz = -p * (log p + entropy),
  grad_hidden = (dz / T) @ W,        grad_W = sum over rows of (dz / T)^T h.
The softmax, the reductions and the head weight's gradient accumulate in fp32; the matmuls run in
the weights' dtype (bf16 on GPU), exactly as the unfused path computes its logits. Between the
matmuls, `chunk_stats` (forward) and `chunk_grad` (backward) are pure functions of a chunk's raw
logits; on CUDA they run through torch.compile, which makes each one or two passes over the bf16
chunk instead of eager torch's several passes over fp32 copies (the memory traffic that would
otherwise rival the matmuls' time at vocab 151,936); elsewhere, and if compiling fails (warned
once), they run eagerly, with the same numbers.

`fused=False` gives the unfused path the runtime can switch to (`training.fusedLogprobs: false`):
one [N, vocab] matmul, fp32 log_softmax, autograd for the rest. It is also the reference the
tests compare the fused path against.

Why not liger-kernel's fused linear cross-entropy: it returns a loss, not log-probs of a
tempered distribution, and no entropy; with per-token outputs (reduction="none") its backward
recomputes the chunks exactly as this one does (its 0.8 releases scaled the head weight's
gradient after summing over tokens, which is wrong for per-token upstream gradients); it syncs
with the host once a call (`.item()`), accumulates the weight gradient in the weight's dtype by
default, and is not installed where the benchmarks run. What its Triton kernel adds, one pass
for the softmax and its gradient, torch.compile generates here from `chunk_grad` on CUDA.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 4096


def chunk_stats(logits: torch.Tensor, targets: torch.Tensor, acc: torch.dtype, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk's (log-sum-exp, log-prob of the target, entropy or None) from its raw logits."""
    z = logits.to(acc)
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, targets[:, None]).squeeze(1) - lse
    if not with_entropy:
        return lse, picked, None
    # -sum p log p, not lse - E_p[z]: that difference cancels when the entropy is small
    log_p = z - lse[:, None]
    return lse, picked, -(log_p.exp() * log_p).sum(dim=-1)


def chunk_grad(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
               grad_logps: torch.Tensor | None, grad_entropy: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """d loss / d logits of one chunk, in the logits' dtype, from its recomputed raw logits.
    (Eager, each line is a pass over an fp32 chunk; names are rebound so that few stay alive.)"""
    log_p = logits.to(lse.dtype)
    if temperature != 1.0:
        log_p = log_p / temperature
    log_p = log_p - lse[:, None]
    p = log_p.exp()
    d = None
    if grad_entropy is not None:  # d entropy / dz = -p (log p + entropy)
        d = (log_p + entropy[:, None]).mul_(p).mul_(-grad_entropy[:, None].to(p.dtype))
    del log_p
    if grad_logps is not None:  # d logp / dz = onehot(target) - p
        g = grad_logps[:, None].to(p.dtype)
        column = torch.arange(p.shape[1], device=p.device)
        p = torch.where(column[None, :] == targets[:, None], g, 0.0) - p * g
        d = p if d is None else d.add_(p)
    if temperature != 1.0:
        d = d / temperature
    return d.to(logits.dtype)


COMPILED_ON = ("cuda",)  # device types whose chunks run through torch.compile (tests add "cpu")
_COMPILED: dict[str, object] = {}
_FALLBACKS: set[str] = set()  # fast paths that failed once in this process (each warned once)


def _kernels(device: torch.device):
    """(chunk_stats, chunk_grad): compiled on CUDA, where inductor fuses each into one or two
    passes over the chunk's bf16 logits (eager torch makes ~6 passes over fp32 copies); eager
    elsewhere, or when compiling failed (warned once)."""
    if device.type not in COMPILED_ON or _COMPILED.get("failed"):
        return chunk_stats, chunk_grad
    if "stats" not in _COMPILED:
        # dynamic: the last chunk of every micro-batch has its own length
        _COMPILED["stats"] = torch.compile(chunk_stats, dynamic=True)
        _COMPILED["grad"] = torch.compile(chunk_grad, dynamic=True)
    return _COMPILED["stats"], _COMPILED["grad"]


def _call(which: str, device: torch.device, *args):
    stats, grad = _kernels(device)
    fn = stats if which == "stats" else grad
    if fn is chunk_stats or fn is chunk_grad:
        return fn(*args)
    try:
        return fn(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # an inductor or Triton failure must not stop training
        from rlkube.runtime.infra.log import warn_once

        warn_once("fused_head_compile", f"torch.compile of the fused lm head failed ({type(e).__name__}: {e}); "
                  "using its eager version (same numbers, more memory traffic)")
        _COMPILED["failed"] = True
        return (chunk_stats if which == "stats" else chunk_grad)(*args)


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with an fp32 `acc`: on CUDA cuBLAS writes the bf16 product's fp32 sum straight
    into it (no [vocab, d] bf16 temporary rounded once a chunk, no separate add pass)."""
    if acc.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and acc.dtype == torch.float32 \
            and "addmm_out_dtype" not in _FALLBACKS:
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            return
        except (RuntimeError, TypeError, NotImplementedError) as e:  # not seen; a torch without it
            from rlkube.runtime.infra.log import warn_once

            warn_once("fused_head_addmm", f"addmm with out_dtype failed ({e}); the head's weight gradient "
                      "is summed through a bf16 product instead")
            _FALLBACKS.add("addmm_out_dtype")
    acc.add_(a @ b)  # addmm's out_dtype has no CPU kernel


class _FusedHeadLogprobs(torch.autograd.Function):
    """(hidden [N, d], weight [V, d], targets [N]) -> (log-probs [N], entropy [N] or [0])."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, temperature: float, with_entropy: bool,
                frozen_head: bool):
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 in gradcheck
        n = hidden.shape[0]
        logps = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty_like(logps)
        entropy = torch.empty_like(logps) if with_entropy else logps.new_empty(0)
        # frozen head (LoRA, a frozen lm_head), log-probs only: grad_hidden_i = g_i * ((onehot - p_i) / T) @ W,
        # and the row's vector is known now; kept ([N, d]), the backward needs no logits at all
        direction = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if frozen_head else lse.new_empty(0)
        for s in range(0, n, chunk):
            rows = slice(s, s + chunk)
            logits = hidden[rows] @ weight.t()  # in the weights' dtype, as the unfused head
            lse_c, picked, ent = _call("stats", hidden.device, logits, targets[rows], acc, temperature, with_entropy)
            lse[rows], logps[rows] = lse_c, picked
            if with_entropy:
                entropy[rows] = ent
            if frozen_head:
                d = _call("grad", hidden.device, logits, targets[rows], lse_c, entropy, torch.ones_like(lse_c), None,
                          temperature)
                direction[rows] = d @ weight
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy, direction)
        ctx.chunk, ctx.temperature, ctx.with_entropy, ctx.frozen_head = chunk, temperature, with_entropy, frozen_head
        ctx.set_materialize_grads(False)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        hidden, weight, targets, lse, entropy, direction = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_logps is None and grad_entropy is None:
            return None, None, None, None, None, None, None
        if ctx.frozen_head:
            return (grad_logps[:, None].to(direction.dtype) * direction).to(hidden.dtype), *(None,) * 6
        chunk = ctx.chunk
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            rows = slice(s, s + chunk)
            h = hidden[rows]
            d = _call("grad", hidden.device, h @ weight.t(), targets[rows], lse[rows],
                      entropy[rows] if ctx.with_entropy else entropy,
                      None if grad_logps is None else grad_logps[rows],
                      None if grad_entropy is None else grad_entropy[rows], ctx.temperature)
            if need_h:
                grad_hidden[rows] = d @ weight
            if need_w:
                _accumulate(grad_weight, d.t(), h)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _materialized(hidden, weight, targets, temperature: float, with_entropy: bool):
    """The unfused path: all [N, vocab] logits at once, autograd for the gradients."""
    acc = torch.promote_types(hidden.dtype, torch.float32)
    z = (hidden @ weight.t()).to(acc) / temperature
    logp = torch.log_softmax(z, dim=-1)
    picked = logp.gather(1, targets[:, None]).squeeze(1)
    if not with_entropy:
        return picked, None
    return picked, -(logp.exp() * logp).sum(dim=-1)


def head_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, chunk: int = DEFAULT_CHUNK,
    temperature: float = 1.0, with_entropy: bool = False, fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [N], entropy [N] or None), fp32, of softmax(hidden @ weight.T / temperature) at
    `targets`. Fused: `chunk` rows of logits at a time; else all rows at once. The division by
    the temperature is on the fp32 logits, as the sampler divides them."""
    if chunk < 1:
        raise ValueError(f"chunk: must be >= 1, got {chunk}")
    if hidden.shape[0] == 0:  # keeps the head in the graph, so every rank reduces the same grads
        empty = hidden.new_zeros(0, dtype=torch.float32) + 0.0 * weight.sum()
        return empty, (empty if with_entropy else None)
    if not fused:
        return _materialized(hidden, weight, targets, temperature, with_entropy)
    frozen_head = torch.is_grad_enabled() and hidden.requires_grad and not weight.requires_grad and not with_entropy
    logps, entropy = _FusedHeadLogprobs.apply(hidden, weight, targets, chunk, temperature, with_entropy, frozen_head)
    return logps, (entropy if with_entropy else None)


def token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = DEFAULT_CHUNK,
    temperature: float = 1.0, fused: bool = True,
) -> torch.Tensor:
    """The log-probs alone of `head_logprobs`."""
    return head_logprobs(hidden, weight, targets, chunk=chunk, temperature=temperature, fused=fused)[0]
