"""The actor as the trainer sees it: a causal LM whose forward gives per-token log-probs of a
response block in a padded rollout batch.

Rollout rows are `[left-padded prompt (P columns) | right-padded response (T columns)]`. The
token in response column t is predicted by the hidden state at column P + t - 1, so the head
only ever sees T positions per row, never the prompt's. The body runs over the rows moved flush
left (`flush_left`), so it attends causally without a mask whatever the prompts' lengths.
Log-probs go through the core's chunked head (`fused_head.head_logprobs`), which never holds a
full-vocabulary logits tensor for the batch, nor for the entropy when it is asked for
(`fused=False`, from `training.fusedLogprobs`, materialises them).

`PolicyModel` is a module rather than a function so that FSDP2 can shard it as the root: the
embedding, final norm and lm head belong to the root unit and are gathered in its pre-forward,
before the chunked head reads `head.weight` directly. Generation calls `policy.lm` (the plain
HF model) while the hybrid engine holds every unit unsharded.

Temperature: the rollout samples from softmax(logits / T), so the policy whose ratio PPO/GRPO
clip is that tempered distribution. Log-probs and entropy here are taken of logits / T too, for
the actor's new and old log-probs and the reference's alike (as TRL and verl do); otherwise the
first epoch's ratio would not be 1 and the KL would compare two different distributions. T = 0
(greedy rollouts) has no tempered distribution: the raw logits (T = 1) are used.
"""

from __future__ import annotations

import torch

from rlkube.runtime.engine.attention import causal_attention
from rlkube.runtime.engine.fused_head import DEFAULT_CHUNK, head_logprobs
from rlkube.runtime.engine.logprobs import body_and_head


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: a copy from pageable memory may wait for
    the stream's queued work (the CUDA driver stages it), so on CUDA the tensor is page-locked
    first (torch's caching host allocator makes that cheap after the first step)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def flush_left(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's tokens moved left past its left padding, and how far each row moved ([B]).

    A rollout row holds its real tokens in one run: left padding, the prompt, the response up to
    EOS, right padding. Moved left, every row is real tokens then padding, so plain causal
    attention with positions 0..n-1 is exact for each real token (as generation saw it) and the
    model needs no mask: sdpa runs its causal flash kernel instead of a masked one, the model
    builds no [B, 1, L, L] mask, and a compiled layer sees one graph whatever the prompts'
    lengths. Computed on the device, without a host wait. The columns after a row's end repeat
    its last column; their outputs are never read."""
    width = input_ids.shape[1]
    shift = (attention_mask.long().cumsum(dim=1) == 0).sum(dim=1)
    source = (torch.arange(width, device=input_ids.device)[None, :] + shift[:, None]).clamp_max(width - 1)
    return input_ids.gather(1, source), shift


def flush_left_hidden(body: torch.nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`body`'s last hidden states [B, L, d] over padded rows moved flush left (`flush_left`), and
    each row's shift: column c of row b is at c - shift[b] in the result. With sdpa the body runs
    causal attention alone, no mask built (engine/attention.py); eager builds its causal mask."""
    ids, shift = flush_left(input_ids, attention_mask)
    with causal_attention(body, ids.shape[1]):
        out = body(input_ids=ids, use_cache=False, attention_mask=None)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden, shift


def response_hidden(body: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    prompt_len: int) -> torch.Tensor:
    """Hidden states [B, T, d] at the positions that predict response columns 0..T-1 (column
    prompt_len + t - 1 of each padded row)."""
    hidden, shift = flush_left_hidden(body, input_ids, attention_mask)
    response_len = input_ids.shape[1] - prompt_len
    columns = torch.arange(prompt_len - 1, prompt_len - 1 + response_len, device=hidden.device)
    # clamp: a row without real tokens (shift = L) reads column 0; its outputs are masked anyway
    at = (columns[None, :] - shift[:, None]).clamp_min(0)
    return hidden.gather(1, at[:, :, None].expand(-1, -1, hidden.shape[-1]))


class PolicyModel(torch.nn.Module):
    """Wraps an HF causal LM (`.lm`); forward -> (log-probs [B, T] fp32, entropy [B, T] or None)
    of the distribution softmax(logits / temperature) the rollout samples from."""

    def __init__(
        self, lm: torch.nn.Module, chunk: int = DEFAULT_CHUNK, temperature: float = 1.0, fused: bool = True,
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk = chunk
        self.fused = fused
        self.temperature = temperature if temperature > 0 else 1.0

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_len: int,
        response_mask: torch.Tensor,
        with_entropy: bool = False,
        host_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`host_mask`: `attention_mask` in host memory. Where the response tokens are decides the
        shapes of the head's work; read from the host copy it costs no wait for the device (the
        trainer passes it: a boolean index on the device waits for the whole body's forward)."""
        body, head = body_and_head(self.lm)
        hidden = response_hidden(body, input_ids, attention_mask, prompt_len)
        valid = response_mask if host_mask is None else host_mask[:, prompt_len:]
        where = valid.bool().flatten().nonzero().squeeze(1)
        where = host_to_device(where, hidden.device) if where.device != hidden.device else where
        picked = hidden.flatten(0, 1).index_select(0, where)
        targets = input_ids[:, prompt_len:].flatten().index_select(0, where)
        logps, ent = head_logprobs(picked, head.weight, targets, chunk=self.chunk, temperature=self.temperature,
                                   with_entropy=with_entropy, fused=self.fused)
        size = response_mask.numel()
        out = logps.new_zeros(size, dtype=torch.float32).index_copy(0, where, logps.float()).view(response_mask.shape)
        entropy = None
        if with_entropy:
            entropy = ent.new_zeros(size, dtype=torch.float32).index_copy(0, where, ent.float()).view(response_mask.shape)
        return out, entropy
