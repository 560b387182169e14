"""Per-token log-probabilities of chosen tokens without materialising full-vocab logits.

`token_logprobs(hidden, weight, targets)` returns log softmax(hidden @ weight.T)[targets] for
each row of `hidden` ([N, d]) — the language-model head and the log-softmax fused and computed
`chunk` rows at a time. A whole micro-batch of full-vocabulary fp32 logits (tokens x 152k for
Qwen) would be the largest tensor of the step; here at most one chunk of it exists at a time,
in the forward *and* the backward pass: the backward recomputes each chunk's logits instead of
keeping them (a custom autograd Function, the same trade gradient checkpointing makes).

Gradients: for row i with target y, d logp / d logits = onehot(y) - softmax(logits), so
grad_hidden = g * (onehot - p) @ W and grad_W = sum_i g_i * (onehot - p_i)^T h_i. The softmax and
the reductions run in fp32; the matmuls in the weights' dtype (bf16 on GPU).

`SequenceLogprobs(lm)` is the module the DPO trainer shards and calls: it runs the model's body
once, picks the hidden states of the positions that predict response tokens (prompt tokens never
touch the head), and sums the log-probs per sequence. With flex_attention and a packed batch it
passes `document_mask(batch)`: a BlockMask (same sequence and causal) built once per micro-batch
on the device and kept on the batch, so the reference and the policy forward share it.
"""

from __future__ import annotations

import torch

from rlkube.runtime.data.packing import TokenBatch

DEFAULT_CHUNK = 4096


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int,
                temperature: float):
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 in gradcheck
        out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            logits = (hidden[s : s + chunk] @ weight.t()).to(acc) / temperature
            picked = logits.gather(1, targets[s : s + chunk, None]).squeeze(1)
            out[s : s + chunk] = picked - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk, ctx.temperature = chunk, temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, targets = ctx.saved_tensors
        chunk = ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(hidden.dtype, torch.float32)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            logits = (h @ weight.t()).to(acc) / ctx.temperature
            # d logp/d logits = (onehot - softmax) / T, scaled by the incoming gradient
            g = grad_out[s : s + chunk, None].to(acc) / ctx.temperature
            d_logits = torch.softmax(logits, dim=-1).mul_(-g)
            d_logits.scatter_add_(1, targets[s : s + chunk, None], g)
            d_logits = d_logits.to(weight.dtype)
            if need_h:
                grad_hidden[s : s + chunk] = d_logits @ weight
            if need_w:
                grad_weight.add_(d_logits.t() @ h)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = DEFAULT_CHUNK,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log softmax(hidden @ weight.T / temperature)[i, targets[i]] for every row i, in fp32, chunk
    by chunk. The division is on the fp32 logits, as the sampler divides them."""
    if hidden.shape[0] == 0:
        return hidden.new_zeros(0, dtype=torch.float32) + 0.0 * weight.sum()
    return _ChunkedTokenLogprobs.apply(hidden, weight, targets, chunk, temperature)


def body_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body (returns hidden states) and the lm head of a causal LM."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    head = model.get_output_embeddings()
    if body is None or head is None:
        raise TypeError(f"{type(model).__name__}: expected a causal LM with a decoder body and an lm head")
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("an lm head with a bias is not supported by the chunked log-prob path")
    return body, head


def document_mask(batch: TokenBatch):
    """flex_attention's BlockMask of a packed batch: a query attends to keys of its own sequence at
    or before it. Sequences are read from the position ids (a new one starts wherever the position
    does not follow the previous one by 1; the right padding is a sequence of its own). Built on
    the batch's device without a host sync, once; later calls return the same mask."""
    if batch.flex_mask is None:
        from torch.nn.attention.flex_attention import create_block_mask

        pos = batch.position_ids
        doc = (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1)

        def same_sequence_causal(b, h, q, kv):
            return (doc[b, q] == doc[b, kv]) & (kv <= q)

        rows, width = pos.shape
        batch.flex_mask = create_block_mask(same_sequence_causal, B=rows, H=None, Q_LEN=width, KV_LEN=width,
                                            device=pos.device, _compile=True)
    return batch.flex_mask


class SequenceLogprobs(torch.nn.Module):
    """A causal LM whose forward returns summed response log-probs per sequence.

    It is a module (not a function) so that FSDP2 can shard it as the root: the embedding, final
    norm and lm head then belong to this module and are unsharded in its pre-forward, before the
    chunked head reads `head.weight` directly.
    """

    def __init__(self, lm: torch.nn.Module, chunk: int = DEFAULT_CHUNK) -> None:
        super().__init__()
        self.lm = lm
        self.chunk = chunk

    def forward(self, batch: TokenBatch, per_token: bool = False) -> torch.Tensor:
        """Summed log-probs per sequence ([2 * pairs] for DPO batches), or with per_token=True the
        log-prob of every target position ([N], aligned with batch.target_ids)."""
        body, head = body_and_head(self.lm)
        mask = batch.attention_mask
        if batch.packed and getattr(self.lm.config, "_attn_implementation", None) == "flex_attention":
            mask = document_mask(batch)
        out = body(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask, use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.target_index)
        logps = token_logprobs(picked, head.weight, batch.target_ids, self.chunk)
        if per_token:
            return logps
        sums = torch.zeros(len(batch.seq_lens), dtype=torch.float32, device=logps.device)
        return sums.index_add(0, batch.target_seq, logps)

