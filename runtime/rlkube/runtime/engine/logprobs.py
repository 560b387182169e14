"""Per-token log-probabilities of a causal LM's response tokens.

The head and the log-softmax are fused (`engine/fused_head.py`): by default no tensor of
[tokens, vocab] logits is ever held, in the forward or the backward pass; `fused=False`
(`training.fusedLogprobs: false`) materialises them, for comparison.

`SequenceLogprobs(lm)` is the module the DPO trainer shards and calls: it runs the model's body
once, picks the hidden states of the positions that predict response tokens (prompt tokens never
touch the head), and sums the log-probs per sequence. With flex_attention and a packed batch it
passes `document_mask(batch)`: a BlockMask (same sequence and causal) built once per micro-batch
on the device and kept on the batch, so the reference and the policy forward share it.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

from rlkube.runtime.data.packing import TokenBatch
from rlkube.runtime.engine.attention import causal_attention
from rlkube.runtime.engine.fused_head import DEFAULT_CHUNK, token_logprobs

__all__ = ["DEFAULT_CHUNK", "SequenceLogprobs", "body_and_head", "document_mask", "token_logprobs"]


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
        pos = batch.position_ids
        doc = (torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1).cumsum(-1)

        def same_sequence_causal(b, h, q, kv):
            return (doc[b, q] == doc[b, kv]) & (kv <= q)

        rows, width = pos.shape
        batch.flex_mask = _compiled_create_block_mask()(same_sequence_causal, B=rows, H=None, Q_LEN=width,
                                                        KV_LEN=width, device=pos.device)
    return batch.flex_mask


@functools.cache
def _compiled_create_block_mask():
    """flex_attention's create_block_mask through torch.compile (no dense [T, T] mask is built),
    dynamic in the row width from the first call: compiled static first, it recompiled on the
    second width (4.8 s of a DPO run's second step on an H200)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask, dynamic=True)


class SequenceLogprobs(torch.nn.Module):
    """A causal LM whose forward returns summed response log-probs per sequence.

    It is a module (not a function) so that FSDP2 can shard it as the root: the embedding, final
    norm and lm head then belong to this module and are unsharded in its pre-forward, before the
    chunked head reads `head.weight` directly.
    """

    def __init__(self, lm: torch.nn.Module, chunk: int = DEFAULT_CHUNK, fused: bool = True) -> None:
        super().__init__()
        self.lm = lm
        self.chunk = chunk
        self.fused = fused

    def forward(self, batch: TokenBatch, per_token: bool = False) -> torch.Tensor:
        """Summed log-probs per sequence ([2 * pairs] for DPO batches), or with per_token=True the
        log-prob of every target position ([N], aligned with batch.target_ids)."""
        body, head = body_and_head(self.lm)
        mask = batch.attention_mask
        if batch.packed and getattr(self.lm.config, "_attn_implementation", None) == "flex_attention":
            mask = document_mask(batch)
        # One sequence a row, right-padded, no mask: causal alone is exact, and with sdpa it runs
        # without transformers' host check for packed positions (engine/attention.py).
        causal = mask is None and not batch.packed
        with causal_attention(body, batch.input_ids.shape[1]) if causal else nullcontext():
            out = body(input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=mask,
                       use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.target_index)
        logps = token_logprobs(picked, head.weight, batch.target_ids, self.chunk, fused=self.fused)
        if per_token:
            return logps
        sums = torch.zeros(len(batch.seq_lens), dtype=torch.float32, device=logps.device)
        return sums.index_add(0, batch.target_seq, logps)

