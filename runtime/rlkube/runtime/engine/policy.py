"""The actor as the trainer sees it: a causal LM whose forward gives per-token log-probs of a
response block in a padded rollout batch.

Rollout rows are `[left-padded prompt (P columns) | right-padded response (T columns)]`. The
token in response column t is predicted by the hidden state at column P + t - 1, so the head
only ever sees T positions per row, never the prompt's. Log-probs go through the core's chunked
head (`fused_head.head_logprobs`), which never holds a full-vocabulary logits tensor for the
batch, nor for the entropy when it is asked for (`fused=False`, from `training.fusedLogprobs`,
materialises them).

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

import functools
import inspect

import torch

from rlkube.runtime.engine.fused_head import DEFAULT_CHUNK, head_logprobs
from rlkube.runtime.engine.generation import attention_mode, padded_causal_mask
from rlkube.runtime.engine.logprobs import body_and_head


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: a copy from pageable memory may wait for
    the stream's queued work (the CUDA driver stages it), so on CUDA the tensor is page-locked
    first (torch's caching host allocator makes that cheap after the first step)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def positions_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting real tokens only (left padding gets 0), as generation used."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def padded_inputs(body: torch.nn.Module, attention_mask: torch.Tensor, mode: str, dtype: torch.dtype,
                  host_mask: torch.Tensor | None = None) -> dict:
    """The attention mask and position ids of `body`'s forward over padded rows (`host_mask`:
    `attention_mask` in host memory, see padded_causal_mask).

    With left padding: the prebuilt mask and the positions of the real tokens. Without: neither, so
    the model's own causal attention and positions 0..L-1 apply, which are exact for every real
    token (a right pad's output is never read, and causal attention keeps real tokens off the pads
    after them). Position ids that stay flat over right padding, given without a mask, made
    transformers build a packed-sequence mask (masked attention instead of the causal kernel).
    With sdpa, where the model takes a prepared mask per layer type (`_takes_mask_mapping`), it
    gets "no mask" for each, which sdpa runs as causal attention: transformers would otherwise check
    on the host whether the positions hold packed sequences, a wait for the device on every
    forward. (Eager attention has no causal mode: it needs the mask transformers builds.)"""
    mask = padded_causal_mask(attention_mask, mode, dtype, host_mask)
    if mask is not None:
        return {"attention_mask": mask, "position_ids": positions_of(attention_mask)}
    types = set(getattr(getattr(body, "config", None), "layer_types", None) or ())
    if mode == "sdpa" and types == {"full_attention"} and _takes_mask_mapping(type(body)):
        return {"attention_mask": {"full_attention": None}}
    return {"attention_mask": None}


@functools.cache
def _takes_mask_mapping(cls: type) -> bool:
    """Whether `cls.forward` accepts the per-layer-type mask mapping that `generate` prepares (a
    dict passed as attention_mask) instead of building its masks."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "isinstance(causal_mask_mapping := attention_mask, dict)" in source


def response_hidden(
    body: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, mode: str,
    dtype: torch.dtype, host_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hidden states [B, T, d] at the positions that predict response columns 0..T-1
    (`host_mask`: `attention_mask` in host memory, see padded_causal_mask)."""
    out = body(input_ids=input_ids, use_cache=False, **padded_inputs(body, attention_mask, mode, dtype, host_mask))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    response_len = input_ids.shape[1] - prompt_len
    return hidden[:, prompt_len - 1 : prompt_len - 1 + response_len]


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
        self.mode = attention_mode(lm)
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
        hidden = response_hidden(body, input_ids, attention_mask, prompt_len, self.mode, head.weight.dtype, host_mask)
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
