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

import torch

from rlkube.runtime.engine.fused_head import DEFAULT_CHUNK, head_logprobs
from rlkube.runtime.engine.generation import attention_mode, padded_causal_mask
from rlkube.runtime.engine.logprobs import body_and_head


def positions_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting real tokens only (left padding gets 0), as generation used."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp_min(0)


def response_hidden(
    body: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, mode: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Hidden states [B, T, d] at the positions that predict response columns 0..T-1."""
    out = body(
        input_ids=input_ids,
        attention_mask=padded_causal_mask(attention_mask, mode, dtype),
        position_ids=positions_of(attention_mask),
        use_cache=False,
    )
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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        body, head = body_and_head(self.lm)
        hidden = response_hidden(body, input_ids, attention_mask, prompt_len, self.mode, head.weight.dtype)
        valid = response_mask.bool()
        picked = hidden[valid]
        targets = input_ids[:, prompt_len:][valid]
        logps, ent = head_logprobs(picked, head.weight, targets, chunk=self.chunk, temperature=self.temperature,
                                   with_entropy=with_entropy, fused=self.fused)
        out = torch.zeros(response_mask.shape, dtype=torch.float32, device=logps.device)
        out = out.masked_scatter(valid, logps)
        entropy = torch.zeros_like(out).masked_scatter(valid, ent) if with_entropy else None
        return out, entropy
