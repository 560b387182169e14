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
the weights' dtype (bf16 on GPU), exactly as the unfused path computes its logits.

`fused=False` gives the unfused path the runtime can switch to (`training.fusedLogprobs: false`):
one [N, vocab] matmul, fp32 log_softmax, autograd for the rest. It is also the reference the
tests compare the fused path against.

Why not liger-kernel's fused linear cross-entropy: it returns a loss, not log-probs of a
tempered distribution, and no entropy; with per-token outputs (reduction="none") its backward
recomputes the chunks exactly as this one does (its 0.8 releases scaled the head weight's
gradient after summing over tokens, which is wrong for per-token upstream gradients); it syncs
with the host once a call (`.item()`), accumulates the weight gradient in the weight's dtype by
default, and is not installed where the benchmarks run. Its Triton kernel fuses the softmax and
the gradient into one pass, the part left here to torch's elementwise kernels.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK = 4096


def _scaled_logits(h: torch.Tensor, weight: torch.Tensor, acc: torch.dtype, temperature: float) -> torch.Tensor:
    z = (h @ weight.t()).to(acc)  # the matmul in the weights' dtype, then fp32 (a new tensor)
    return z.div_(temperature) if temperature != 1.0 else z


class _FusedHeadLogprobs(torch.autograd.Function):
    """(hidden [N, d], weight [V, d], targets [N]) -> (log-probs [N], entropy [N] or [0])."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, temperature: float, with_entropy: bool):
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 in gradcheck
        n = hidden.shape[0]
        logps = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty_like(logps)
        entropy = torch.empty_like(logps) if with_entropy else logps.new_empty(0)
        for s in range(0, n, chunk):
            z = _scaled_logits(hidden[s : s + chunk], weight, acc, temperature)
            lse_c = torch.logsumexp(z, dim=-1)
            lse[s : s + chunk] = lse_c
            logps[s : s + chunk] = z.gather(1, targets[s : s + chunk, None]).squeeze(1) - lse_c
            if with_entropy:
                # -sum p log p, not lse - E_p[z]: that difference cancels when the entropy is small
                log_p = z.sub_(lse_c[:, None])
                entropy[s : s + chunk] = -(log_p.exp().mul_(log_p)).sum(dim=-1)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.chunk, ctx.temperature, ctx.with_entropy = chunk, temperature, with_entropy
        ctx.set_materialize_grads(False)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if not ctx.with_entropy:
            grad_entropy = None
        if grad_logps is None and grad_entropy is None:
            return None, None, None, None, None, None
        acc, t, chunk = lse.dtype, ctx.temperature, ctx.chunk
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            log_p = _scaled_logits(h, weight, acc, t).sub_(lse[s : s + chunk, None])
            p = log_p.exp()
            if grad_entropy is not None:
                # -g_ent * p * (log p + H), built in log_p's buffer
                d = log_p.add_(entropy[s : s + chunk, None]).mul_(p).mul_(-grad_entropy[s : s + chunk, None].to(acc))
                if grad_logps is not None:
                    d.sub_(p.mul_(grad_logps[s : s + chunk, None].to(acc)))
            else:
                del log_p
                d = p.mul_(-grad_logps[s : s + chunk, None].to(acc))
            if grad_logps is not None:
                d.scatter_add_(1, targets[s : s + chunk, None], grad_logps[s : s + chunk, None].to(acc))
            if t != 1.0:
                d.div_(t)
            d = d.to(weight.dtype)
            if need_h:
                grad_hidden[s : s + chunk] = d @ weight
            if need_w:
                grad_weight.add_(d.t() @ h)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


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
    logps, entropy = _FusedHeadLogprobs.apply(hidden, weight, targets, chunk, temperature, with_entropy)
    return logps, (entropy if with_entropy else None)


def token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = DEFAULT_CHUNK,
    temperature: float = 1.0, fused: bool = True,
) -> torch.Tensor:
    """The log-probs alone of `head_logprobs`."""
    return head_logprobs(hidden, weight, targets, chunk=chunk, temperature=temperature, fused=fused)[0]
